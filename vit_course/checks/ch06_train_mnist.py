"""Chapter 06's exercises: train_step, evaluate and the learning-rate schedule warmup_cosine: checks and rules (each
slip written as the knob of a small factory that produces it, named by running it on the learner's input)."""

# ruff: noqa: B023  (each diagnosis thunk is called in the loop iteration that builds it)

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import train as ref
from .core import IN_PLACE, PLAIN_NUMBER, Slip, Variant, check
from .messages import describe

# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "train_step": ("train-mode", "loss", "float32", "step"),
    "evaluate": ("output", "batches", "eval-mode", "no-grad", "restore", "error"),
    "warmup_cosine": ("output",),
}


# ---- the catalogue of train_step: one wrong implementation per knob
def _train_step(train=True, zero="before", smoothing=True, softmax=False, out="detach", full=True, loss="ce",
                reduction="mean", late=False, step=True):
    def train_step(model, images, labels, optimizer, label_smoothing=0.0, scaler=None):
        if train:
            model.train()
        if zero == "before":
            optimizer.zero_grad()
        logits = model(images).float() if full else model(images)  # (b, K)
        eps = label_smoothing if smoothing else 0.0
        logits = logits.softmax(-1) if softmax else logits
        if loss == "nll":  # nll_loss on raw logits, without log_softmax
            value = F.nll_loss(logits, labels)
        elif loss == "k-1":  # eps spread over the K-1 other classes only
            k = logits.shape[-1]
            target = torch.full_like(logits, eps / (k - 1)).scatter(1, labels[:, None], 1 - eps)  # (b, K)
            value = -(target * logits.log_softmax(-1)).sum(-1).mean()
        else:
            value = F.cross_entropy(logits, labels, label_smoothing=eps, reduction=reduction)
        value.backward()
        if zero == "between":
            optimizer.zero_grad()
        if step:
            optimizer.step()
        if zero == "after":
            optimizer.zero_grad()
        if late:  # the loss measured again after the step
            value = F.cross_entropy(model(images).float(), labels, label_smoothing=eps)
        return {"detach": value.detach(), "item": value.item(), "attached": value}[out]
    return train_step


def _step_in_place(model, images, labels, optimizer, label_smoothing=0.0, scaler=None):
    images -= images.mean()  # "centre the batch first", in the caller's tensor
    return ref.train_step(model, images, labels, optimizer, label_smoothing)


TRAIN = ("call model.train() at the start: dropout and DropPath only act in training mode (the model may come back "
         "from evaluate in eval mode)")
NO_STEP = ("call loss.backward() and then optimizer.step(), with optimizer.zero_grad() before backward() (zero_grad() "
           "between backward() and step() throws the gradients away)")
ACCUMULATE = "the gradients accumulate from step to step: call optimizer.zero_grad() before loss.backward()"
SOFTMAX = "softmax is applied before cross_entropy: F.cross_entropy takes the raw logits"
HOST_READ = ("return the loss as a tensor, `loss.detach()`: `.item()` or `float()` makes the host wait for the device "
             "at every step; the training loop reads the losses only when it shows them")
ATTACHED = ("return `loss.detach()`: this loss still holds the step's autograd graph, which stays in memory for as "
            "long as the caller keeps the loss")
SLIPS = [
    Slip("train_step", "no_train", "train-mode", TRAIN, _train_step(train=False)),
    Slip("train_step", "no_zero_grad", "step", ACCUMULATE, _train_step(zero=None)),
    Slip("train_step", "zero_between", "step", NO_STEP, _train_step(zero="between")),
    Slip("train_step", "no_step", "step", NO_STEP, _train_step(step=False)),
    Slip("train_step", "no_smoothing", "loss", "label_smoothing is ignored: pass it on, F.cross_entropy(..., "
         "label_smoothing=label_smoothing)", _train_step(smoothing=False)),
    Slip("train_step", "softmax", "loss", SOFTMAX, _train_step(softmax=True)),
    Slip("train_step", "nll", "loss", "F.nll_loss expects log-probabilities: apply log_softmax first, or use "
         "F.cross_entropy on the raw logits", _train_step(loss="nll")),
    Slip("train_step", "smoothing_k-1", "loss", "label smoothing spreads epsilon over all K classes, the true one "
         "included (epsilon/K each, 1 - epsilon + epsilon/K on the true class), not epsilon/(K-1) over the others: "
         "F.cross_entropy(..., label_smoothing=epsilon) does it", _train_step(loss="k-1")),
    Slip("train_step", "late", "loss", "the loss is computed after optimizer.step(): return the loss of this step's "
         "forward pass", _train_step(late=True)),
    Slip("train_step", "sum", "loss", "this is the sum of the samples' losses: train on their mean, "
         "F.cross_entropy's default reduction", _train_step(reduction="sum")),
    Slip("train_step", "item", "loss", HOST_READ, _train_step(out="item")),
    Slip("train_step", "attached", "loss", ATTACHED, _train_step(out="attached")),
    Slip("train_step", "low_precision", "float32", "the loss is computed on the model's low-precision logits: compute "
         "it in float32, F.cross_entropy(logits.float(), labels, ...)", _train_step(full=False)),
    Slip("train_step", "centred", "inputs", IN_PLACE, _step_in_place),
]


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


@check("train_step")
def train_step(c, fn):
    """train_step(model, images, labels, optimizer, label_smoothing=0.0) -> loss (a detached 0-dim tensor): training
    mode, the label-smoothed cross-entropy on float32 logits, then one full optimizer step."""
    g = torch.Generator().manual_seed(20)
    for smoothing, dtype in ((0.0, torch.float32), (0.1, torch.float32), (0.1, torch.bfloat16)):
        learner, twin = Probe(dtype=dtype), Probe(dtype=dtype)  # twin: the same start, trained by the reference
        twin.load_state_dict(learner.state_dict())
        learner.eval(), twin.eval()  # train_step must switch to training mode itself
        opt_l = torch.optim.SGD(learner.parameters(), lr=0.5, momentum=0.9)
        opt_r = torch.optim.SGD(twin.parameters(), lr=0.5, momentum=0.9)
        for step in range(3):
            _one_step(c, fn, (learner, opt_l), (twin, opt_r), smoothing, step, g)


def _one_step(c, fn, mine, theirs, smoothing, step, g):
    (learner, opt_l), (twin, opt_r) = mine, theirs
    images, labels = _batch(g, 8)
    before = copy.deepcopy(mine)  # the model and its optimizer together, for the catalogue's slips to replay
    kwargs = {"label_smoothing": smoothing} if smoothing else {}
    c.phase("loss")
    got = _loss_tensor(c, c.call(fn, learner, images, labels, opt_l, **kwargs))
    expected = float(ref.train_step(twin, images, labels, opt_r, smoothing))
    c.phase("train-mode")
    c.ok(learner.calls and all(training for training, _ in learner.calls), "the model ran in eval mode", TRAIN)
    c.phase("float32" if learner.dtype != torch.float32 else "loss")
    if not math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6):
        def replay(impl):  # a slip run on a copy of the model and optimizer as they were before this step
            model, optimizer = copy.deepcopy(before)
            out = impl(model, images, labels, optimizer, **kwargs)
            return float(out.detach() if torch.is_tensor(out) else out)
        shown = f"label_smoothing={smoothing}" + (", bfloat16 logits" if learner.dtype != torch.float32 else "")
        c.fail(f"step {step} ({shown}) returned loss {got:.6g}, expected {expected:.6g}", c.diagnose(
            c.slips("loss", "float32"), lambda loss: math.isclose(loss, got, rel_tol=1e-5, abs_tol=1e-7), replay))
    c.passed()
    c.phase("step")
    if torch.equal(before[0].fc.weight, learner.fc.weight):
        c.fail(f"after step {step} the weights have not changed", NO_STEP)
    if not torch.allclose(learner.fc.weight, twin.fc.weight, atol=1e-5, rtol=1e-4):
        c.fail(f"after step {step} the weights differ from one correct SGD step",
               ACCUMULATE if step > 0 else "one zero_grad, one backward and one step per call")
    c.passed()
    learner.calls.clear()


def _loss_tensor(c, loss):
    """The returned loss, a 0-dim tensor cut from the graph, as a float."""
    if loss is None:
        c.fail("train_step returned None", "a function without a `return` statement returns None: end it with "
               "`return loss.detach()`")
    if not torch.is_tensor(loss):
        c.fail(f"the returned loss should be a 0-dim tensor, got {describe(loss)}", HOST_READ)
    if loss.ndim != 0:
        c.fail(f"the returned loss should be a 0-dim tensor (the batch's mean loss), got {describe(loss)}", None)
    if loss.requires_grad:
        c.fail("the returned loss is still attached to the autograd graph", ATTACHED)
    return c.number(loss.item(), "the returned loss")


# ---- the catalogue of evaluate
def _evaluate(eval_mode=True, grad="off", per_batch=False, percent=False, restore="mode", empty=True, smoothing=0.0,
              softmax=False, count_first=False, accuracy="all", swapped=False):
    def evaluate(model, batches):
        was_training = model.training
        if eval_mode:
            model.eval()
        if grad == "frozen":  # "without gradients" read as: the parameters stop asking for them
            for p in model.parameters():
                p.requires_grad_(False)
        if grad == "left_off":
            torch.set_grad_enabled(False)
        count = sum(len(y) for _, y in batches) if count_first is True else 0  # a first pass over the batches
        if count_first == "len":
            len(batches)  # a generator has no len()
        losses, correct, accuracies = [], 0, []
        with torch.set_grad_enabled(grad == "on"):
            for x, y in batches:
                logits = model(x).float()  # (b, K)
                logits = logits.softmax(-1) if softmax else logits
                losses.append(F.cross_entropy(logits, y, label_smoothing=smoothing,
                                              reduction="mean" if per_batch else "sum").item())
                hits = ((logits.argmin(-1) if accuracy == "argmin" else logits.argmax(-1)) == y).sum().item()
                correct, accuracies = correct + hits, accuracies + [hits / len(y)]
                count += 0 if count_first is True else len(y)
        if restore == "mode":
            model.train(was_training)
        elif restore == "train":
            model.train()
        if count == 0 and empty:
            raise ValueError("evaluate got no batches")
        loss = sum(losses) / len(losses) if per_batch else sum(losses) / count
        share = sum(accuracies) / len(accuracies) if accuracy == "per_batch" else correct / count
        return (share, loss) if swapped else (loss, (100 if percent else 1) * share)
    return evaluate


def _evaluate_in_place(model, batches):
    for x, _ in batches:
        x /= x.abs().max()
    return ref.evaluate(model, batches)


@torch.inference_mode()
def _evaluate_inference_mode(model, batches):
    with ref.eval_mode(model):
        pairs = [(model(x), y) for x, y in batches]  # one pass: batches may be a generator
    if not pairs:
        raise ValueError("evaluate needs at least one batch")
    logits, labels = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])  # (n, K), (n,)
    return F.cross_entropy(logits, labels).item(), (logits.argmax(1) == labels).float().mean().item()


RESTORE = ("remember `was_training = model.training` before model.eval(), and restore it at the end with "
           "model.train(was_training) (in a `finally:` block, so an error cannot leave the wrong mode)")
GENERATOR = ("the batches may come one at a time (a generator, a DataLoader), which runs out after one pass: go "
             "through them once, counting the samples as you go (no len(), no first pass to count them)")
NO_GRAD = ("wrap the loop in `with torch.no_grad():` (or decorate evaluate with @torch.no_grad()): no graph, less "
           "memory, faster")
FROZEN = ("the parameters were frozen (requires_grad_(False)) and stay frozen for training: run without gradients "
          "with `with torch.no_grad():` or @torch.no_grad(), which leave the parameters as they are")
LEFT_OFF = ("gradients stay switched off after evaluate returns (torch.set_grad_enabled(False)): the next training "
            "step cannot backpropagate; use `with torch.no_grad():` or @torch.no_grad(), which switch them back on")
SLIPS += [
    Slip("evaluate", "no_eval", "eval-mode", "call model.eval() first: dropout and DropPath must be off when "
         "measuring", _evaluate(eval_mode=False)),
    Slip("evaluate", "grad", "no-grad", NO_GRAD, _evaluate(grad="on")),
    Slip("evaluate", "frozen", "no-grad", FROZEN, _evaluate(grad="frozen")),
    Slip("evaluate", "left_off", "no-grad", LEFT_OFF, _evaluate(grad="left_off")),
    Slip("evaluate", "batch_means", "output", "this is the mean of the batch means: batches differ in size, so sum "
         "the per-sample losses (reduction='sum') and divide by the number of samples", _evaluate(per_batch=True)),
    Slip("evaluate", "batch_accuracies", "output", "this is the mean of the batch accuracies: count the correct "
         "predictions over all samples, then divide by the number of samples", _evaluate(accuracy="per_batch")),
    Slip("evaluate", "argmin", "output", "the prediction is the class with the largest logit: argmax, not argmin",
         _evaluate(accuracy="argmin")),
    Slip("evaluate", "swapped", "output", "the pair is (mean_loss, accuracy), in that order", _evaluate(swapped=True)),
    Slip("evaluate", "percent", "output", "this looks like a percentage: return the fraction correct, 0..1",
         _evaluate(percent=True)),
    Slip("evaluate", "smoothing", "output", "this loss is label-smoothed: evaluate measures the plain cross-entropy "
         "(label smoothing belongs to training only)", _evaluate(smoothing=0.1)),
    Slip("evaluate", "softmax", "output", SOFTMAX, _evaluate(softmax=True)),
    Slip("evaluate", "count_first", "batches", GENERATOR, _evaluate(count_first=True)),
    Slip("evaluate", "len", "batches", GENERATOR, _evaluate(count_first="len")),
    Slip("evaluate", "not_restored", "restore", RESTORE, _evaluate(restore=None)),
    Slip("evaluate", "always_train", "restore", RESTORE, _evaluate(restore="train")),
    Slip("evaluate", "zero_division", "error", "count the samples, and raise a ValueError when there were none "
         "(instead of dividing by 0)", _evaluate(empty=False)),
    Slip("evaluate", "normalised", "inputs", IN_PLACE, _evaluate_in_place),
]


def _evaluate_values(c, model, batches, sizes, result):
    """The mean loss per sample and the accuracy over all samples; a mismatch named from the catalogue."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        c.fail(f"should return a pair (mean_loss, accuracy), got {type(result).__name__}")
    loss, accuracy = c.number(result[0], "the mean loss"), c.number(result[1], "the accuracy")
    expected = ref.evaluate(copy.deepcopy(model), batches)
    slips = c.slips("output")
    for i, (what, got) in enumerate((("mean loss", loss), ("accuracy", accuracy))):
        if not math.isclose(got, expected[i], rel_tol=1e-5, abs_tol=1e-9):
            c.fail(f"{what} {got:.6g} over batches of sizes {sizes}, expected {expected[i]:.6g}", c.diagnose(
                slips, lambda out, i=i, got=got: math.isclose(out[i], got, rel_tol=1e-5, abs_tol=1e-9),
                lambda impl: impl(copy.deepcopy(model), batches)))
        c.passed()


def _evaluate_call(c, fn, model, batches, one_pass):
    """The learner's evaluate on a list, or on a generator of the same batches (any error there: one pass only)."""
    if not one_pass:
        return c.call(fn, model, batches)
    try:
        return c.call(fn, model, (b for b in batches), label="evaluate")
    except AssertionError as error:  # CheckFailed: a stub stays "not done yet"
        if str(error).startswith("not done yet"):
            raise
        c.fail(f"with the batches given as a generator: {str(error).split(': ', 1)[1].split(chr(10))[0]}", GENERATOR)


@check("evaluate")
def evaluate(c, fn):
    """evaluate(model, batches) -> (mean loss per sample, accuracy 0..1), in eval mode, without gradients (the
    parameters and the grad mode left as they were); the model's mode is restored; batches may be a generator;
    no batches is a ValueError."""
    g = torch.Generator().manual_seed(21)
    for sizes, training, one_pass in (((7, 5, 3), True, False), ((4,), True, False), ((6, 6, 1, 2), True, False),
                                      ((3, 5), False, False), ((2, 4, 3), True, True)):
        c.phase("batches" if one_pass else "output")
        model = Probe().train(training)
        batches = [_batch(g, b) for b in sizes]
        grad_mode = torch.is_grad_enabled()
        result = _evaluate_call(c, fn, model, batches, one_pass)
        left_off = grad_mode and not torch.is_grad_enabled()
        frozen = not all(p.requires_grad for p in model.parameters())
        torch.set_grad_enabled(grad_mode)
        after, (calls, model.calls) = model.training, (model.calls, [])
        c.ok(len(calls) == len(sizes), f"the model ran {len(calls)} times for {len(sizes)} batches",
             GENERATOR if one_pass else "one forward pass per batch")
        c.phase("eval-mode")
        c.ok(not any(mode for mode, _ in calls), "the model ran in training mode", SLIPS_OF["no_eval"])
        c.phase("no-grad")
        c.ok(not any(grad for _, grad in calls), "gradients were tracked during evaluation", NO_GRAD)
        c.ok(not frozen, "after evaluate the model's parameters no longer require gradients", FROZEN)
        c.ok(not left_off, "after evaluate gradients are switched off (torch.is_grad_enabled() is False)", LEFT_OFF)
        c.phase("batches" if one_pass else "output")
        _evaluate_values(c, model, batches, sizes, result)
        model.calls = []
        c.phase("restore")
        modes = ("training" if training else "eval", "training" if after else "eval")
        c.ok(after == training, f"the model came in {modes[0]} mode and evaluate left it in {modes[1]} mode",
             RESTORE)
    c.raises(fn, Probe(), [], why="no batches at all", hint=SLIPS_OF["zero_division"], rule="error")


# ---- the catalogue of warmup_cosine: the rate of each slip at one step
def _schedule(kind=None):
    def warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0):
        if step < warmup_steps or (kind == "<=" and step <= warmup_steps and warmup_steps):
            rise = {"warmup0": step / warmup_steps, "warmup+1": (step + 1) / (warmup_steps + 1)}.get(
                kind, (step + 1) / warmup_steps)
            return min_lr + (base_lr - min_lr) * rise if kind == "warmup_min" else base_lr * rise
        span = {"total": total_steps, "end-1": total_steps - warmup_steps - 1, "no_max": total_steps - warmup_steps,
                "from0": total_steps}.get(kind, max(1, total_steps - warmup_steps))
        done = step if kind in ("from0", "from0/") else step - warmup_steps
        t = done // span if kind == "//" else min(1.0, done / max(1, span)) if kind == "end-1" else done / span
        low = 0.0 if kind == "no_min" else min_lr
        wave = {"linear": 2 * (1 - t) - 1, "quarter": 2 * math.cos(math.pi * t / 2) - 1,
                "degrees": math.cos(180 * t), "sin": math.sin(math.pi * t)}.get(kind, math.cos(math.pi * t))
        rate = low + (base_lr - low) * 0.5 * (1 + wave)
        return torch.tensor(rate) if kind == "tensor" else rate
    return warmup_cosine


SLIPS += [Slip("warmup_cosine", kind, "output", hint, _schedule(kind)) for kind, hint in [
    ("warmup0", "the warmup is off by one: step 0 should already get base_lr / warmup_steps, base_lr * (step + 1) / "
                "warmup_steps, so no step is wasted at lr 0"),
    ("warmup+1", "the warmup divides by warmup_steps + 1: base_lr * (step + 1) / warmup_steps reaches base_lr at the "
                 "last warmup step"),
    ("warmup_min", "the warmup starts from min_lr: it rises from 0, base_lr * (step + 1) / warmup_steps"),
    ("<=", "the warmup goes on at step = warmup_steps: it covers the steps 0..warmup_steps - 1 (`step < "
           "warmup_steps`), so the cosine starts at base_lr exactly"),
    ("no_min", "the cosine ends at 0, not min_lr: min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * t))"),
    ("from0", "the cosine phase starts counting at step 0: t = (step - warmup_steps) / (total_steps - warmup_steps)"),
    ("from0/", "the cosine phase starts counting at step 0: t = (step - warmup_steps) / (total_steps - warmup_steps)"),
    ("total", "the cosine phase is divided by total_steps: t = (step - warmup_steps) / (total_steps - warmup_steps)"),
    ("end-1", "the cosine reaches min_lr one step early: t = (step - warmup_steps) / (total_steps - warmup_steps), "
              "which is 1 at step = total_steps"),
    ("//", "t is computed with integer division (//), so it jumps from 0 to 1: use /"),
    ("linear", "this decays linearly: after the warmup use 0.5 * (1 + cos(pi * t))"),
    ("quarter", "this is a quarter of a cosine, cos(pi * t / 2): the schedule is 0.5 * (1 + cos(pi * t)), half a "
                "period from base_lr to min_lr"),
    ("sin", "this uses a sine: the schedule is 0.5 * (1 + cos(pi * t)), base_lr at t = 0 and min_lr at t = 1"),
    ("degrees", "math.cos takes radians: cos(pi * t) with math.pi, not cos(180 * t)"),
    ("no_max", "with total_steps == warmup_steps the cosine phase has length 0: divide by max(1, total_steps - "
               "warmup_steps), as the formula says"),
    ("tensor", PLAIN_NUMBER),
]]
SLIPS_OF = {s.name: s for s in SLIPS}


@check("warmup_cosine")
def warmup_cosine(c, fn):
    """warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0): linear warmup, then cosine to min_lr,
    which it reaches at step = total_steps (or right after the warmup when there is no step left for it)."""
    slips = c.slips()
    for total, warmup, base, low in ((20, 5, 1e-3, 1e-5), (10, 0, 0.1, 0.0), (7, 3, 2.0, 0.5), (50, 1, 5e-4, 0.0),
                                     (4, 4, 0.1, 0.01)):
        kwargs = {"min_lr": low} if low else {}
        for step in range(total + 1):
            args = (step, total, warmup, base)
            got = c.number(c.call(fn, *args, errors=[("division by zero", SLIPS_OF["no_max"].hint)], **kwargs),
                           f"the learning rate at step {step}")
            expected = ref.warmup_cosine(*args, low)
            if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12):
                c.fail(f"at step {step} of {total} (warmup {warmup}, base_lr {base}, min_lr {low}) the rate is "
                       f"{got:.6g}, expected {expected:.6g}", c.diagnose(
                           slips, lambda rate: math.isclose(rate, got, rel_tol=1e-6, abs_tol=1e-12),
                           lambda impl: impl(*args, **kwargs)))
            c.passed()


def _schedule_variant(step, total_steps, warmup_steps, base_lr, min_lr=0.0):
    if warmup_steps and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(total_steps - warmup_steps, 1))
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(progress * math.pi))


VARIANTS = [
    Variant("train_step", "reference", ref.train_step), Variant("train_step", "plain", _train_step()),
    Variant("train_step", "zero_grad_after", _train_step(zero="after")),
    Variant("evaluate", "reference", ref.evaluate), Variant("evaluate", "plain", _evaluate()),
    Variant("evaluate", "inference_mode", _evaluate_inference_mode),
    Variant("warmup_cosine", "reference", ref.warmup_cosine), Variant("warmup_cosine", "clamped", _schedule_variant),
]
