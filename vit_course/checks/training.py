"""Checks for chapters 06-07: train_step, evaluate, warmup_cosine (references in ``vit_course.train``)."""

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .core import check


class Probe(nn.Module):
    """A tiny classifier that remembers the mode and grad setting of every forward pass."""

    def __init__(self, in_features=12, classes=5):
        super().__init__()
        self.fc = nn.Linear(in_features, classes)
        self.calls = []  # (training, grad enabled) per forward

    def forward(self, x):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return self.fc(x.flatten(1) if x.ndim > 2 else x) * 3  # (b, classes), confident enough to matter


def _batch(g, b, classes=5):
    return torch.randn(b, 3, 2, 2, generator=g), torch.randint(classes, (b,), generator=g)


@check("train_step")
def train_step(c, fn):
    """train_step(model, images, labels, optimizer, label_smoothing=0.0) -> loss (float): one full SGD step."""
    from .. import train as ref

    g = torch.Generator().manual_seed(20)
    for smoothing in (0.0, 0.1):
        learner, reference = Probe(), Probe()
        reference.load_state_dict(learner.state_dict())
        learner.eval(), reference.eval()  # train_step must switch to training mode itself
        opt_l = torch.optim.SGD(learner.parameters(), lr=0.5, momentum=0.9)
        opt_r = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
        for step in range(3):
            images, labels = _batch(g, 8)
            before = copy.deepcopy(learner.fc)
            kwargs = {"label_smoothing": smoothing} if smoothing else {}
            got = c.number(c.call(fn, learner, images, labels, opt_l, **kwargs), "the returned loss")
            expected = ref.train_step(reference, images, labels, opt_r, smoothing)
            if not learner.calls or not all(training for training, _ in learner.calls):
                c.fail("the model ran in eval mode", "call model.train() at the start: dropout and DropPath "
                       "only act in training mode (the model may come back from evaluate in eval mode)")
            if not math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6):
                with torch.no_grad():
                    logits = before(images.flatten(1)) * 3
                hints = [
                    ("label_smoothing is ignored: pass it on, F.cross_entropy(..., label_smoothing=label_smoothing)",
                     F.cross_entropy(logits, labels)),
                    ("softmax is applied before cross_entropy: F.cross_entropy takes the raw logits",
                     F.cross_entropy(logits.softmax(-1), labels, label_smoothing=smoothing)),
                    ("the loss is computed after optimizer.step(): return the loss of this step's forward pass",
                     F.cross_entropy(learner(images), labels, label_smoothing=smoothing)),
                ]
                hint = next((h for h, v in hints if math.isclose(got, float(v), rel_tol=1e-5)), None)
                c.fail(f"step {step} (label_smoothing={smoothing}) returned loss {got:.6g}, expected {expected:.6g}",
                       hint)
            c.tests += 1
            if torch.equal(before.weight, learner.fc.weight):
                c.fail(f"after step {step} the weights have not changed",
                       "call loss.backward() and then optimizer.step()")
            if not torch.allclose(learner.fc.weight, reference.fc.weight, atol=1e-5, rtol=1e-4):
                c.fail(f"after step {step} the weights differ from one correct SGD step",
                       "the gradients accumulate from step to step: call optimizer.zero_grad() before "
                       "loss.backward()" if step > 0 else "one zero_grad, one backward and one step per call")
            c.tests += 1
            learner.calls.clear()


@check("evaluate")
def evaluate(c, fn):
    """evaluate(model, batches) -> (mean loss per sample, accuracy 0..1), in eval mode, without gradients."""
    from .. import train as ref

    g = torch.Generator().manual_seed(21)
    for sizes in ((7, 5, 3), (4,), (6, 6, 1, 2)):
        model = Probe().train()
        batches = [_batch(g, b) for b in sizes]
        result = c.call(fn, model, batches)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            c.fail(f"should return a pair (mean_loss, accuracy), got {type(result).__name__}")
        loss, accuracy = c.number(result[0], "the mean loss"), c.number(result[1], "the accuracy")
        calls = model.calls
        c.ok(len(calls) == len(sizes), f"the model ran {len(calls)} times for {len(sizes)} batches",
             "one forward pass per batch")
        c.ok(not any(training for training, _ in calls), "the model ran in training mode",
             "call model.eval() first: dropout and DropPath must be off when measuring")
        c.ok(not any(grad for _, grad in calls), "gradients were tracked during evaluation",
             "wrap the loop in `with torch.no_grad():` (or decorate evaluate with @torch.no_grad()): no graph, "
             "less memory, faster")
        model.calls = []
        expected_loss, expected_acc = ref.evaluate(copy.deepcopy(model), batches)
        with torch.no_grad():
            batch_means = [F.cross_entropy(model(x), y).item() for x, y in batches]
            batch_accs = [(model(x).argmax(1) == y).float().mean().item() for x, y in batches]
        if not math.isclose(loss, expected_loss, rel_tol=1e-5):
            hint = ("this is the mean of the batch means: batches differ in size, so sum the per-sample losses "
                    "(reduction='sum') and divide by the number of samples") if math.isclose(
                loss, sum(batch_means) / len(batch_means), rel_tol=1e-5) else None
            c.fail(f"mean loss {loss:.6g} over batches of sizes {sizes}, expected {expected_loss:.6g}", hint)
        c.tests += 1
        if not math.isclose(accuracy, expected_acc, rel_tol=1e-6, abs_tol=1e-9):
            hint = ("this looks like a percentage: return the fraction correct, 0..1" if math.isclose(
                accuracy, 100 * expected_acc) else "this is the mean of the batch accuracies: count the correct "
                "predictions over all samples, then divide by the number of samples" if math.isclose(
                accuracy, sum(batch_accs) / len(batch_accs)) else None)
            c.fail(f"accuracy {accuracy:.6g} over batches of sizes {sizes}, expected {expected_acc:.6g}", hint)
        c.tests += 1


@check("warmup_cosine")
def warmup_cosine(c, fn):
    """warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0): linear warmup, then cosine to min_lr."""
    from .. import train as ref

    def wrong(step, total, warmup, base, low, kind):
        if step < warmup:
            return base * step / warmup if kind == "warmup0" else base * (step + 1) / warmup
        t = {"from0": step / max(1, total), "total": (step - warmup) / max(1, total)}.get(
            kind, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return low + (base - low) * (1 - t)
        if kind == "nomin":
            return base * 0.5 * (1 + math.cos(math.pi * t))
        return low + (base - low) * 0.5 * (1 + math.cos(math.pi * t))

    hints = {
        "warmup0": "the warmup is off by one: step 0 should already get base_lr / warmup_steps, "
                   "base_lr * (step + 1) / warmup_steps, so no step is wasted at lr 0",
        "nomin": "the cosine ends at 0, not min_lr: min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * t))",
        "from0": "the cosine phase starts counting at step 0: t = (step - warmup_steps) / (total_steps - warmup_steps)",
        "total": "the cosine phase is divided by total_steps: t = (step - warmup_steps) / (total_steps - warmup_steps)",
        "linear": "this decays linearly: after the warmup use 0.5 * (1 + cos(pi * t))",
    }
    for total, warmup, base, low in ((20, 5, 1e-3, 1e-5), (10, 0, 0.1, 0.0), (7, 3, 2.0, 0.5), (50, 1, 5e-4, 0.0)):
        kwargs = {"min_lr": low} if low else {}
        for step in range(total):
            got = c.number(c.call(fn, step, total, warmup, base, **kwargs), f"the learning rate at step {step}")
            expected = ref.warmup_cosine(step, total, warmup, base, low)
            if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12):
                hint = next((h for kind, h in hints.items() if math.isclose(
                    got, wrong(step, total, warmup, base, low, kind), rel_tol=1e-6, abs_tol=1e-12)), None)
                c.fail(f"at step {step} of {total} (warmup {warmup}, base_lr {base}, min_lr {low}) the rate is "
                       f"{got:.6g}, expected {expected:.6g}", hint)
            c.tests += 1
