"""The training loop (chapters 06-07): ``fit``, the settings it trains with, and its optional time budget.

``fit`` is AdamW (no weight decay on norms, biases, tokens and position embeddings; fused into one kernel where
the device has it), the learning rate of ``train.warmup_cosine`` set before every step, label smoothing, an
evaluation on the validation split every ``eval_every`` epochs, progress bars, a checkpoint at each evaluation that
a run can resume from (``--resume``), and, given a test loader, one evaluation on the test set at the very end.

Everything decided while or about training (when to stop, which epoch, which setting) looks at the validation
split, images held out of the training set (``batches.loaders``); the test set is read once, when the run is done.

The host never waits for the device inside the loop: ``train_step`` hands back the loss as a tensor on the
device, and the loop reads the losses (one transfer for all the steps since the last read) only when a person
looks, about once a second for the progress bar and at the end of an epoch. On a GPU the host thus stays ahead,
queueing kernels while the device computes. On CUDA the step is also compiled: the whole of it, from a batch's
indices to the updated weights, as two graphs (``whole_step``), where the loader and PyTorch allow, else the model.
"""

import dataclasses
import functools
import itertools
import math
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .checkpoint import read_checkpoint, save_checkpoint
from .device import amp_settings, pick_device, precision, restore_state, resume_state  # noqa: F401 (precision)
from .train import evaluate, evaluate_flips, param_groups, train_step, warmup_cosine

HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "val_acc", "lr", "seconds")  # one entry per evaluation
FUSED_ADAMW = ("cpu", "cuda")  # devices whose AdamW runs fused (MPS's is newer than some PyTorch versions we support)
READ_EVERY = 1.0  # seconds between reads of the training losses (the progress bar refreshes as often)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How ``fit`` trains: a recipe's ``"train"`` settings, its batch size aside (that is the loader's).

    epochs: passes over the training set; None: as many as ``time_budget`` holds
    lr, min_lr: the learning rate at the end of the warmup, and where the cosine ends
    weight_decay: AdamW's, on weight matrices only (``train.param_groups``)
    warmup_epochs: of linear warmup (may be fractional); a run of no more epochs ends still warming up, never
        decayed (under a time budget, whose steps are not known ahead, the warmup is cut to half the run instead)
    label_smoothing: the loss's epsilon
    amp: mixed precision (see ``precision``): "auto", "bf16", "fp16" or "off"
    test_flips: the test evaluation also averages each test image with its mirror (``train.evaluate_flips``)
    time_budget: seconds for the training and its final evaluations (None: no limit)
    seed: of dropout and stochastic depth, which draw from torch's global generator
    eval_every: evaluate (and write the checkpoint) after every this many epochs, and after the last one: a long
        GPU plan evaluates now and then, not after each of its short epochs
    compile: compile the training step (``whole_step``, or the model alone where the whole step cannot be
        compiled); None: on CUDA only (on a CPU compiling the course's small models did not pay, see the appendix)
    """

    epochs: int | None
    lr: float
    weight_decay: float
    warmup_epochs: float
    label_smoothing: float
    min_lr: float = 0.0
    amp: str = "auto"
    test_flips: bool = False
    time_budget: float | None = None
    seed: int = 0
    eval_every: int = 1
    compile: bool | None = None

    def __post_init__(self):
        if self.epochs is not None and (not isinstance(self.epochs, int) or self.epochs < 1):
            raise ValueError(f"epochs must be a whole number >= 1 (or None, with a time_budget), got {self.epochs!r}")
        if self.time_budget is not None and not 0 < self.time_budget < math.inf:
            raise ValueError(f"time_budget must be a positive number of seconds (or None), got {self.time_budget!r}")
        if not isinstance(self.eval_every, int) or self.eval_every < 1:
            raise ValueError(f"eval_every must be a whole number of epochs >= 1, got {self.eval_every!r}")


class Budget:
    """A run's seconds, counted across resumed stretches, and what an optional limit leaves for training.

    The final evaluations must fit in the limit too, so their seconds are set aside: ``final_batches`` evaluation
    batches (the last validation pass, and the test pass), each as long as a batch of the last validation pass, or
    before there is one as a guess from the step time (an evaluation batch costs about half a training step).
    """

    def __init__(self, seconds=None, spent=0.0, final_batches=1):
        self.seconds, self.started = seconds, time.perf_counter() - spent
        self.final_batches = final_batches
        self.step_seconds, self.batch_seconds = 0.0, None  # one evaluation batch, once measured
        self.steps_seen = 0

    def elapsed(self):
        return time.perf_counter() - self.started

    def record_step(self, seconds):
        """A running mean of the step time. A stretch's first step is left out: it pays for the start-up (on a GPU
        its context and kernel choices, seconds where a step takes milliseconds), and a final evaluation guessed
        from it could take the whole budget."""
        self.steps_seen += 1
        if self.steps_seen > 1:
            self.step_seconds = seconds if self.step_seconds == 0 else 0.9 * self.step_seconds + 0.1 * seconds

    def left(self):
        """Seconds left for training steps, the final evaluations set aside (inf without a limit)."""
        if self.seconds is None:
            return math.inf
        per_batch = self.batch_seconds if self.batch_seconds is not None else 0.5 * self.step_seconds
        return self.seconds - self.final_batches * per_batch - self.elapsed()

    def used(self):
        """The share of the training time used so far, 0..1."""
        return self.elapsed() / max(self.elapsed() + self.left(), 1e-9)


def learning_rate(config, step, steps_per_epoch, budget):
    """The learning rate of ``step``: ``warmup_cosine`` over the steps the run plans, epochs x steps per epoch.

    Under a time budget the schedule follows the clock too, so a run the budget cuts still ends decayed: it stands
    at the steps done or at the share of the budget used, whichever is further (and a warmup longer than the steps
    the budget holds takes the first half of them). With epochs=None the planned
    steps are those the budget holds at the pace so far (before there is a pace: warmup, then the peak), so a
    faster machine plans more of them.
    """
    total = math.inf if config.epochs is None else config.epochs * steps_per_epoch
    if budget.seconds is not None:
        used = budget.used()
        if config.epochs is None:
            total = max(step + 1, round(step / used)) if used > 0 and step > 0 else math.inf
        else:
            step = max(step, int(total * used))
    warmup = round(config.warmup_epochs * steps_per_epoch)
    if budget.seconds is not None and warmup >= total:  # else the budget would end the run before any decay
        warmup = total // 2
    return warmup_cosine(min(step, total - 1), total, warmup, config.lr, config.min_lr)


def fit(model, train_loader, val_loader, config=None, *, test_loader=None, device=None, checkpoint=None, resume=False,
        progress=True, run_info=None, **settings):
    """Train ``model`` with AdamW and a per-step warmup-cosine schedule; evaluate on the validation split after
    every ``eval_every`` epochs, and on the test set once, at the end.

    Args:
        train_loader, val_loader, test_loader (optional): iterables of (x (b, C, H, W), y (b,)) with a len(), as
            ``batches.loaders`` makes them; one with ``set_epoch`` is told the epoch a resumed run starts at
        config: a ``TrainConfig``; settings: its fields as keywords, which replace config's, e.g.
            ``fit(model, train, val, epochs=3, lr=2e-3, weight_decay=0.05, warmup_epochs=0.5, label_smoothing=0.1)``;
            device: None picks CUDA, then MPS, then the CPU
        checkpoint: a path, written atomically at each evaluation (config, weights, optimizer, history, random state);
            with ``resume=True`` and that file present, training continues after its last epoch; run_info: plain
            values it stores too; progress: a bar per epoch and a line after it
    Returns the history: dict of lists, one entry per evaluation: epoch (fractional where the budget cut it),
    train_loss (the mean since the previous evaluation), val_loss, val_acc, lr, seconds (cumulative); with a
    test_loader also "test": {"loss", "acc"} of the trained model (one view; with test_flips also "flip_acc").
    Without a time budget a CPU run repeats exactly, a GPU run nearly. KeyboardInterrupt: the model is left in eval
    mode with the last step's weights, the checkpoint keeps the last finished epoch, and the interrupt is re-raised.
    """
    config = dataclasses.replace(config, **settings) if config is not None else TrainConfig(**settings)
    _check_run(config, model, checkpoint)
    device = pick_device(device)
    model.to(device)
    autocast, scaler = amp_settings(config.amp, device)
    whole = _compiles_whole_step(config, device, scaler, train_loader)
    optimizer = _optimizer(model, config, device, tensor_lr=whole)
    history, start, step, spent = _start(resume and checkpoint, model, optimizer, train_loader, progress, scaler,
                                         config.seed)
    run_step, epoch_batches = _stepper(model, optimizer, train_loader, config, device, scaler, whole)
    budget = _budget(config, spent, val_loader, test_loader)
    since_eval = []  # the training losses since the last evaluation: its train_loss is their mean
    try:
        for epoch in itertools.count(start) if config.epochs is None else range(start, config.epochs):
            bar = _bar(epoch_batches(), f"epoch {epoch + 1}/{config.epochs or '(budget)'}", progress)
            losses, lr, step = _train_epoch(run_step, bar, optimizer, step, config, budget, autocast)
            since_eval += losses
            last = epoch + 1 == config.epochs or budget.left() <= 0
            if not last and (epoch + 1) % config.eval_every:
                continue
            val_loss, val_acc = _evaluate(model, val_loader, autocast, budget)
            done = epoch + len(losses) / len(train_loader)  # fractional when the budget cut the epoch
            _record(history, epoch=done, train_loss=sum(since_eval) / max(len(since_eval), 1),
                    val_loss=val_loss, val_acc=val_acc, lr=lr, seconds=budget.elapsed(), progress=progress)
            since_eval = []
            if checkpoint is not None:
                save_checkpoint(checkpoint, model, history=history, optimizer=optimizer, epoch=epoch + 1, step=step,
                                seconds=history["seconds"][-1], **resume_state(device, scaler), **(run_info or {}))
            if last or budget.left() <= 0:
                break
    except KeyboardInterrupt:
        model.eval()
        if progress:
            tqdm.write(f"interrupted; the last finished epoch is in {checkpoint}" if checkpoint else "interrupted")
        raise
    if test_loader is not None:
        history["test"] = _test(model, test_loader, autocast, config.test_flips, progress)
    model.eval()
    return history


def _optimizer(model, config, device, tensor_lr=False):
    """AdamW over ``param_groups``, fused into one kernel where the device has it (no host read of the step counts);
    with ``tensor_lr``, for ``whole_step``, its learning rate a tensor on the device, which a compiled step reads as
    an input (a number would be baked into the graph), and the update written for a compiled graph instead."""
    if tensor_lr:  # CUDA's multi-tensor update takes a tensor rate only as "capturable"; a CPU's per-tensor one
        cuda = device.type == "cuda"
        return torch.optim.AdamW(param_groups(model, config.weight_decay), lr=torch.tensor(config.lr, device=device),
                                 foreach=cuda, capturable=cuda)
    fused = device.type in FUSED_ADAMW
    return torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, fused=fused)


def _compiles_whole_step(config, device, scaler, loader):
    """Whether ``fit`` compiles the whole step (``whole_step``): compiling is asked for (``config.compile``; None: on
    CUDA), no GradScaler (its step reads a value back), a ``DeviceLoader`` (it can make a batch inside the step)
    whose augmentation and mixing are the package's, and a PyTorch whose compiler traces the backward (2.11 on)."""
    from . import augment, batches  # the functions a compiled graph has been traced through

    known = {None, *batches.AUGMENT.values(), augment.mix_batch}
    parts = [getattr(loader, name, None) for name in ("augment", "mix")]
    return (_compiles(config, device) and scaler is None and hasattr(loader, "indices")
            and hasattr(torch._dynamo.config, "trace_autograd_ops")
            and all(getattr(part, "func", part) in known for part in parts))


def _compiles(config, device):
    return config.compile if config.compile is not None else device.type == "cuda"


def _stepper(model, optimizer, loader, config, device, scaler, whole):
    """-> (what runs one training step, what gives an epoch's inputs to it): ``whole_step`` on each batch's indices,
    or ``train_step`` on each batch of ``loader``, on the model compiled alone where compiling is asked for."""
    if whole:  # two compiled graphs a step; they draw the batches' augmentation from the global generator too
        for group in optimizer.param_groups:  # a checkpoint's may be a number, which a graph would hold fixed
            group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32, device=device)
        return whole_step(model, optimizer, loader, config.label_smoothing), loader.indices
    forward = torch.compile(model) if _compiles(config, device) else model  # the same parameters: ``model`` is saved
    run = functools.partial(_eager_step, forward, optimizer, config.label_smoothing, scaler, device)
    return run, lambda: loader


def whole_step(model, optimizer, loader, label_smoothing=0.0, backend="inductor"):
    """One training step from a batch's indices to the updated weights, compiled: gather, augment, normalise and mix
    (``loader.batch``), forward, loss and backward as one graph, and AdamW's update of every parameter as a second.

    -> step(index (b,)) -> the batch's mean loss, a 0-dim tensor on the device; ``step.graphs`` holds the two
    functions compiled (for ``torch._dynamo.explain``); ``backend``: the compiler's ("eager" traces only, for tests).

    Two graphs, not one, because PyTorch's optimizers mark their update as a graph of its own (so that it compiles
    as an in-place update without gradients); nothing runs between the two but the call. The backward is traced
    into the first graph (Dynamo's ``trace_autograd_ops``); the update reads a tensor learning rate, which ``fit``
    sets in place. The batch's random choices come from torch's global generator, as a ``torch.Generator`` cannot
    enter a graph: a seeded run repeats on its device, with other draws than the eager loader's. The first graph is
    compiled with ``fullgraph=True``, so that a graph break is found, not silently paid every step: if it does not
    compile (a model of one's own may hold code the compiler cannot trace) a warning names the cause, and the steps
    make the batch eagerly and run ``train_step`` on the model compiled alone.
    """
    def forward_backward(index):
        x, y = loader.batch(index)  # (b, C, H, W), (b,) or (b, classes)
        loss = F.cross_entropy(model(x).float(), y, label_smoothing=label_smoothing)
        value = loss.detach()  # taken before the backward, which frees what ``loss`` hangs on
        loss.backward()
        return value

    def update():
        optimizer.step()

    compiled_forward_backward = torch.compile(forward_backward, fullgraph=True, backend=backend)
    compiled_update = torch.compile(update, backend=backend)
    fallback = None

    def run(index):
        nonlocal fallback
        model.train()
        if fallback is None:
            try:
                optimizer.zero_grad(set_to_none=True)  # drops the gradients, no kernel; Dynamo skips it
                with torch._dynamo.config.patch(trace_autograd_ops=True):
                    loss = compiled_forward_backward(index)
                compiled_update()
                return loss
            except torch._dynamo.exc.TorchDynamoException as error:  # raised while compiling, before that graph ran
                reason = str(error).strip().splitlines()[0]
                warnings.warn(f"the training step's forward and backward do not compile into one graph ({reason}); "
                              "training with the model compiled alone", stacklevel=2)
                fallback = torch.compile(model, backend=backend)
        return train_step(fallback, *loader.batch(index), optimizer, label_smoothing)

    run.graphs = {"forward_backward": forward_backward, "update": update}
    return run


def _eager_step(model, optimizer, label_smoothing, scaler, device, batch):
    """``train_step`` on a loader's (x, y), moved to ``device`` (a no-op for the course's loaders)."""
    x, y = (t.to(device) for t in batch)
    return train_step(model, x, y, optimizer, label_smoothing, scaler)


def _bar(batches, description, progress):
    """An epoch's progress bar, updated at most once a second: in a notebook each update is a widget message, and a
    flood of them overflows the kernel's output queue, which drops messages (nbval then waits for one that never
    comes)."""
    return tqdm(batches, desc=description, leave=False, disable=not progress, mininterval=1.0)


def _train_epoch(run_step, bar, optimizer, step, config, budget, autocast):
    """One pass over the batches in ``bar`` (cut short when the budget runs out): -> (losses, last lr, step).

    Each step's loss stays on the device (``run_step`` returns a tensor) until ``_read_losses`` fetches all those
    not yet read in one transfer: when the progress bar is due to refresh (about once a second) and at the end.
    """
    losses, unread, lr = [], [], learning_rate(config, step, len(bar), budget)
    read_at = time.perf_counter()
    for batch in bar:
        tick = time.perf_counter()
        lr = learning_rate(config, step, len(bar), budget)
        for group in optimizer.param_groups:
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(lr)  # in place: the compiled step reads this tensor
            else:
                group["lr"] = lr
        with autocast or nullcontext():  # the whole step: backward keeps the forward's dtypes; AdamW is no autocast op
            unread.append((step, lr, run_step(batch)))
        budget.record_step(time.perf_counter() - tick)
        step += 1
        out_of_time = budget.left() <= 0
        if time.perf_counter() - read_at >= READ_EVERY or out_of_time:
            losses += _read_losses(unread)
            unread, read_at = [], time.perf_counter()
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}", lr=f"{lr:.1e}", refresh=False)
        if out_of_time:
            break
    return losses + _read_losses(unread), lr, step


def _read_losses(unread):
    """[(step, lr, loss tensor)] -> the losses as floats, read from the device in one transfer; the first that is
    not finite raises FloatingPointError naming its step and learning rate."""
    if not unread:
        return []
    values = torch.stack([loss for _, _, loss in unread]).float().tolist()  # the one host read
    for (step, lr, _), value in zip(unread, values, strict=True):
        if not math.isfinite(value):
            raise FloatingPointError(f"loss became {value} at step {step} (lr {lr:.2e})")
    return values


def _check_run(config, model, checkpoint):
    """Refuse, before any training, a run with no end (no epochs and no time budget) and a checkpoint that
    ``save_checkpoint`` could not write (a model without .config)."""
    if config.epochs is None and config.time_budget is None:
        raise ValueError("epochs=None trains until the time budget is used: give a time_budget, or a number of epochs")
    if checkpoint is not None and not isinstance(getattr(model, "config", None), dict):
        raise ValueError(f"checkpoint={checkpoint}: a checkpoint stores a ViT with its .config; {type(model).__name__} "
                         "has none, so train it without a checkpoint")


def _start(checkpoint, model, optimizer, train_loader, progress, scaler, seed=0):
    """-> (history, epoch, step, seconds) of a fresh run, its global generator seeded with ``seed`` (dropout and
    stochastic depth draw from it), or of the run in ``checkpoint`` (None or False: fresh) if it exists, loaded into
    model, optimizer and ``restore_state``; the loader (refused if empty) is told the epoch."""
    if len(train_loader) == 0:
        raise ValueError(f"the training loader yields no batch: {len(getattr(train_loader, 'labels', ()))} images with "
                         f"batch size {getattr(train_loader, 'batch_size', '?')} (drop_last drops an incomplete batch)")
    torch.manual_seed(seed)
    history, start, step, spent = {key: [] for key in HISTORY_KEYS}, 0, 0, 0.0
    if checkpoint and Path(checkpoint).exists():  # a folder: read_checkpoint says so
        state = read_checkpoint(checkpoint)
        if "optimizer" not in state:
            raise ValueError(f"{checkpoint} holds a finished model (no optimizer state): resume from the run's "
                             "checkpoint.pt, not its model.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        restore_state(state, next(model.parameters()).device, scaler)  # the model is on the run's device
        history, start, step, spent = state["history"], state["epoch"], state["step"], state["seconds"]
        for key in HISTORY_KEYS:  # a run begun before validation splits evaluated on the test set: no val numbers
            history.setdefault(key, [None] * len(history.get("epoch", ())))
        if progress:
            tqdm.write(f"resuming from {checkpoint} after epoch {start}")
    if hasattr(train_loader, "set_epoch"):
        train_loader.set_epoch(start)
    return history, start, step, spent


def _budget(config, spent, val_loader, test_loader):
    """The run's ``Budget``, with its final evaluations set aside: the last validation pass and the test passes
    (with test-time flips three: one view, then both views)."""
    test_passes = 0 if test_loader is None else 3 if config.test_flips else 1
    return Budget(config.time_budget, spent, final_batches=len(val_loader) + test_passes * len(test_loader or ()))


def _evaluate(model, val_loader, autocast, budget):
    """``evaluate`` under autocast if any; its seconds per batch go to the budget. -> (loss, accuracy)."""
    tick = time.perf_counter()
    with autocast or nullcontext():
        loss, accuracy = evaluate(model, val_loader)
    budget.batch_seconds = (time.perf_counter() - tick) / max(len(val_loader), 1)
    return loss, accuracy


def _test(model, test_loader, autocast, flips, progress):
    """The trained model on the test set, read once: -> {"loss", "acc"} (one view), with flips also "flip_acc"."""
    with autocast or nullcontext():
        loss, accuracy, *flip_acc = evaluate_flips(model, test_loader) if flips else evaluate(model, test_loader)
    result = {"loss": round(loss, 6), "acc": round(accuracy, 6)}
    if flips:
        result["flip_acc"] = round(flip_acc[0], 6)
    if progress:
        tqdm.write(f"test set, read once: loss {loss:.4f}, acc {accuracy:.2%}"
                   + (f"; with test-time flips (each image and its mirror) {flip_acc[0]:.2%}" if flips else ""))
    return result


def _record(history, *, progress, **values):
    """Append one epoch's values (rounded floats) to the history, and print a line."""
    for key in HISTORY_KEYS:
        history[key].append(round(values[key], 6) if isinstance(values[key], float) else values[key])
    if progress:
        tqdm.write(f"epoch {values['epoch']:.2f}: train loss {values['train_loss']:.4f}, val loss "
                   f"{values['val_loss']:.4f}, val acc {values['val_acc']:.2%}, {values['seconds']:.0f} s")


__all__ = ["Budget", "TrainConfig", "amp_settings", "fit", "learning_rate", "precision", "whole_step"]
