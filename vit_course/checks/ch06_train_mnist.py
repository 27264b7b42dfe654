"""Chapter 06's exercises: train_step, evaluate and the learning-rate schedule warmup_cosine."""

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import train as ref
from .core import check


class Probe(nn.Module):
    """A tiny classifier that remembers the mode and grad setting of every forward pass; ``dtype``: its logits'
    (bfloat16 stands in for a model under mixed precision)."""

    def __init__(self, in_features=12, classes=5, dtype=torch.float32):
        super().__init__()
        self.fc = nn.Linear(in_features, classes)
        self.calls = []  # (training, grad enabled) per forward
        self.dtype = dtype

    def forward(self, x):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return (self.fc(x.flatten(1) if x.ndim > 2 else x) * 3).to(self.dtype)  # (b, classes), confident enough


def _batch(g, b, classes=5):
    return torch.randn(b, 3, 2, 2, generator=g), torch.randint(classes, (b,), generator=g)


def _loss_hint(got, before, learner, images, labels, smoothing):
    """The mistake whose loss equals ``got``, or None."""
    with torch.no_grad():
        logits = before(images.flatten(1)) * 3
        low = logits.to(learner.dtype)
        hints = [
            ("the loss is computed on the model's low-precision logits: compute it in float32, "
             "F.cross_entropy(logits.float(), labels, ...)",
             F.cross_entropy(low, labels, label_smoothing=smoothing) if learner.dtype != torch.float32 else None),
            ("label_smoothing is ignored: pass it on, F.cross_entropy(..., label_smoothing=label_smoothing)",
             F.cross_entropy(logits, labels)),
            ("softmax is applied before cross_entropy: F.cross_entropy takes the raw logits",
             F.cross_entropy(logits.softmax(-1), labels, label_smoothing=smoothing)),
            ("the loss is computed after optimizer.step(): return the loss of this step's forward pass",
             F.cross_entropy(learner(images), labels, label_smoothing=smoothing)),
            ("this is the sum of the samples' losses: train on their mean, F.cross_entropy's default reduction",
             F.cross_entropy(logits, labels, reduction="sum", label_smoothing=smoothing)),
        ]
    learner.calls.pop()  # the diagnosis' own forward pass
    return next((h for h, v in hints if v is not None and math.isclose(got, float(v), rel_tol=1e-5)), None)


@check("train_step")
def train_step(c, fn):
    """train_step(model, images, labels, optimizer, label_smoothing=0.0) -> loss (float): training mode, the
    label-smoothed cross-entropy on float32 logits, then one full optimizer step."""
    g = torch.Generator().manual_seed(20)
    for smoothing, dtype in ((0.0, torch.float32), (0.1, torch.float32), (0.1, torch.bfloat16)):
        learner, twin = Probe(dtype=dtype), Probe(dtype=dtype)  # twin: the same start, trained by the reference
        twin.load_state_dict(learner.state_dict())
        learner.eval(), twin.eval()  # train_step must switch to training mode itself
        opt_l = torch.optim.SGD(learner.parameters(), lr=0.5, momentum=0.9)
        opt_r = torch.optim.SGD(twin.parameters(), lr=0.5, momentum=0.9)
        for step in range(3):
            _one_step(c, fn, learner, twin, opt_l, opt_r, smoothing, step, g)


def _one_step(c, fn, learner, twin, opt_l, opt_r, smoothing, step, g):
    images, labels = _batch(g, 8)
    before = copy.deepcopy(learner.fc)
    kwargs = {"label_smoothing": smoothing} if smoothing else {}
    c.phase("loss")
    got = c.number(c.call(fn, learner, images, labels, opt_l, **kwargs), "the returned loss")
    expected = ref.train_step(twin, images, labels, opt_r, smoothing)
    c.phase("train-mode")
    c.ok(learner.calls and all(training for training, _ in learner.calls), "the model ran in eval mode",
         "call model.train() at the start: dropout and DropPath only act in training mode (the model may come back "
         "from evaluate in eval mode)")
    c.phase("float32" if learner.dtype != torch.float32 else "loss")
    if not math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6):
        shown = f"label_smoothing={smoothing}" + (", bfloat16 logits" if learner.dtype != torch.float32 else "")
        c.fail(f"step {step} ({shown}) returned loss {got:.6g}, expected {expected:.6g}",
               _loss_hint(got, before, learner, images, labels, smoothing))
    c.tests += 1
    c.phase("step")
    if torch.equal(before.weight, learner.fc.weight):
        c.fail(f"after step {step} the weights have not changed",
               "call loss.backward() and then optimizer.step(), with optimizer.zero_grad() before "
               "backward() (zero_grad() between backward() and step() throws the gradients away)")
    if not torch.allclose(learner.fc.weight, twin.fc.weight, atol=1e-5, rtol=1e-4):
        c.fail(f"after step {step} the weights differ from one correct SGD step",
               "the gradients accumulate from step to step: call optimizer.zero_grad() before "
               "loss.backward()" if step > 0 else "one zero_grad, one backward and one step per call")
    c.tests += 1
    learner.calls.clear()


def _evaluate_values(c, model, batches, sizes, loss, accuracy):
    """The mean loss per sample and the accuracy over all samples, with the hints of the usual slips."""
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


RESTORE = ("remember `was_training = model.training` before model.eval(), and restore it at the end with "
           "model.train(was_training) (in a `finally:` block, so an error cannot leave the wrong mode)")


@check("evaluate")
def evaluate(c, fn):
    """evaluate(model, batches) -> (mean loss per sample, accuracy 0..1), in eval mode, without gradients; the
    model's mode is restored; batches may be a generator; no batches is a ValueError."""
    g = torch.Generator().manual_seed(21)
    for sizes, training, one_pass in (((7, 5, 3), True, False), ((4,), True, False), ((6, 6, 1, 2), True, False),
                                      ((3, 5), False, False), ((2, 4, 3), True, True)):
        c.phase("batches" if one_pass else "output")
        model = Probe().train(training)
        batches = [_batch(g, b) for b in sizes]
        result = c.call(fn, model, (b for b in batches) if one_pass else batches)
        after = model.training
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            c.fail(f"should return a pair (mean_loss, accuracy), got {type(result).__name__}")
        loss, accuracy = c.number(result[0], "the mean loss"), c.number(result[1], "the accuracy")
        calls, model.calls = model.calls, []
        c.ok(len(calls) == len(sizes), f"the model ran {len(calls)} times for {len(sizes)} batches",
             "one forward pass per batch")
        c.phase("eval-mode")
        c.ok(not any(mode for mode, _ in calls), "the model ran in training mode",
             "call model.eval() first: dropout and DropPath must be off when measuring")
        c.phase("no-grad")
        c.ok(not any(grad for _, grad in calls), "gradients were tracked during evaluation",
             "wrap the loop in `with torch.no_grad():` (or decorate evaluate with @torch.no_grad()): no graph, "
             "less memory, faster")
        c.phase("batches" if one_pass else "output")
        _evaluate_values(c, model, batches, sizes, loss, accuracy)
        model.calls = []
        c.phase("restore")
        modes = ("training" if training else "eval", "training" if after else "eval")
        c.ok(after == training, f"the model came in {modes[0]} mode and evaluate left it in {modes[1]} mode",
             RESTORE)
    c.raises(fn, Probe(), [], why="no batches at all", hint="count the samples, and raise a ValueError when "
             "there were none (instead of dividing by 0)", rule="error")


SCHEDULE_HINTS = {
    "warmup0": "the warmup is off by one: step 0 should already get base_lr / warmup_steps, "
               "base_lr * (step + 1) / warmup_steps, so no step is wasted at lr 0",
    "warmup+1": "the warmup divides by warmup_steps + 1: base_lr * (step + 1) / warmup_steps reaches base_lr at the "
                "last warmup step",
    "warmup_min": "the warmup starts from min_lr: it rises from 0, base_lr * (step + 1) / warmup_steps",
    "nomin": "the cosine ends at 0, not min_lr: min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * t))",
    "from0": "the cosine phase starts counting at step 0: t = (step - warmup_steps) / (total_steps - warmup_steps)",
    "total": "the cosine phase is divided by total_steps: t = (step - warmup_steps) / (total_steps - warmup_steps)",
    "end-1": "the cosine reaches min_lr one step early: t = (step - warmup_steps) / (total_steps - warmup_steps), "
             "which is 1 at step = total_steps",
    "linear": "this decays linearly: after the warmup use 0.5 * (1 + cos(pi * t))",
}


def _wrong(step, total, warmup, base, low, kind):
    """The rate of the mistake ``kind`` (a key of SCHEDULE_HINTS)."""
    if step < warmup:
        rise = {"warmup0": step / warmup, "warmup+1": (step + 1) / (warmup + 1)}.get(kind, (step + 1) / warmup)
        return low + (base - low) * rise if kind == "warmup_min" else base * rise
    t = {"from0": step / max(1, total), "total": (step - warmup) / max(1, total),
         "end-1": (step - warmup) / max(1, total - warmup - 1)}.get(kind, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return low + (base - low) * (1 - t)
    if kind == "nomin":
        return base * 0.5 * (1 + math.cos(math.pi * t))
    return low + (base - low) * 0.5 * (1 + math.cos(math.pi * t))


@check("warmup_cosine")
def warmup_cosine(c, fn):
    """warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0): linear warmup, then cosine to min_lr,
    which it reaches at step = total_steps."""
    for total, warmup, base, low in ((20, 5, 1e-3, 1e-5), (10, 0, 0.1, 0.0), (7, 3, 2.0, 0.5), (50, 1, 5e-4, 0.0)):
        kwargs = {"min_lr": low} if low else {}
        for step in range(total + 1):
            got = c.number(c.call(fn, step, total, warmup, base, **kwargs), f"the learning rate at step {step}")
            expected = ref.warmup_cosine(step, total, warmup, base, low)
            if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12):
                hint = next((h for kind, h in SCHEDULE_HINTS.items() if math.isclose(
                    got, _wrong(step, total, warmup, base, low, kind), rel_tol=1e-6, abs_tol=1e-12)), None)
                c.fail(f"at step {step} of {total} (warmup {warmup}, base_lr {base}, min_lr {low}) the rate is "
                       f"{got:.6g}, expected {expected:.6g}", hint)
            c.tests += 1


# each exercise's rules: the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule)
# and the words that state it in the exercise's statement
RULES = {
    "train_step": {
        "train-mode": "put the model in training mode",
        "loss": "the loss of this batch as a Python `float`",
        "float32": "(on float32 logits)",
        "step": "clear the old gradients; backpropagate; step the optimizer",
    },
    "evaluate": {
        "output": "`(mean_loss, accuracy)`: the cross-entropy averaged over all samples",
        "batches": "`batches`, any iterable of `(x, y)` pairs",
        "eval-mode": "Run without gradients and in eval mode",
        "no-grad": "Run without gradients",
        "restore": "leave the model in the mode it came in",
        "error": "If there were no batches at all, raise a `ValueError`",
    },
    "warmup_cosine": {
        "output": "the formula above",
    },
}
