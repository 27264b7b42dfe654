"""The training loop (chapters 06-07): ``fit`` and the clock and schedule it follows.

``fit`` is AdamW (no weight decay on norms, biases, tokens and position embeddings), linear warmup then cosine
decay per step, label smoothing, an evaluation after every epoch (optionally with test-time flips at the last),
progress bars, an optional time budget, and atomic checkpoints after every epoch that a run can resume from
(``--resume``).
"""

import itertools
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .checkpoint import read_checkpoint, save_checkpoint
from .device import pick_device
from .precision import amp_settings, resolve_amp
from .train import evaluate, evaluate_flips, param_groups, train_step, warmup_cosine

HISTORY_KEYS = ("epoch", "train_loss", "test_loss", "test_acc", "lr", "seconds")


class Clock:
    """A run's seconds, across resumed stretches, and what is left of an optional time budget.

    The budget covers the training steps and the final evaluation, whose cost is estimated from the last
    evaluation, or before there is one from the step time (a test batch costs about a third of a step), times
    ``final_passes``: the forward passes per test image of the final evaluation (2 with test-time flips).
    """

    def __init__(self, budget=None, spent=0.0, final_passes=1):
        self.budget, self.started, self.final_passes = budget, time.perf_counter() - spent, final_passes
        self.eval_seconds, self.step_seconds = None, 0.0

    def elapsed(self):
        return time.perf_counter() - self.started

    def record_step(self, seconds):  # a running mean
        self.step_seconds = seconds if self.step_seconds == 0 else 0.9 * self.step_seconds + 0.1 * seconds

    def left(self, test_batches):
        """Seconds left for training steps, the final evaluation set aside (inf without a budget)."""
        if self.budget is None:
            return math.inf
        one_pass = self.eval_seconds if self.eval_seconds is not None else 0.5 * self.step_seconds * test_batches
        return self.budget - self.final_passes * one_pass - self.elapsed()

    def position(self, step, total_steps, test_batches):
        """Where the schedule stands: -> (step, total steps) for ``warmup_cosine``.

        Without a budget, the steps done out of the planned ones. With a budget and planned steps, the share of
        the budget used if that is further along than the steps. With a budget and no planned steps (a run that
        fills its budget), the steps done out of the steps the budget is on course to hold at the present pace,
        so a faster machine plans more steps and every run ends its budget at the schedule's end.
        """
        if self.budget is None:
            return step, total_steps
        used = self.elapsed() / max(self.elapsed() + self.left(test_batches), 1e-9)
        if total_steps is not None:
            return max(step, int(total_steps * used)), total_steps
        return step, (max(step + 1, round(step / used)) if used > 0 and step > 0 else math.inf)  # no pace yet: inf


def _resume(path, model, optimizer, progress):
    """Load a resumable checkpoint into model and optimizer: -> (history, epoch, step, seconds)."""
    state = read_checkpoint(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if progress:
        tqdm.write(f"resuming from {path} after epoch {state['epoch']}")
    return state["history"], state["epoch"], state["step"], state["seconds"]


def _train_epoch(model, loader, optimizer, schedule, clock, step, *, label_smoothing, autocast, scaler, desc,
                 progress, on_step, test_batches):
    """One pass over ``loader`` (cut short when the budget runs out): -> (losses, last lr, step)."""
    losses, lr = [], schedule(step)
    # at most one bar update a second: in a notebook each update is a widget message, and a flood of them
    # overflows the kernel's output queue, which drops messages (nbval then waits for one that never comes)
    bar = tqdm(loader, desc=desc, leave=False, disable=not progress, mininterval=1.0)
    for x, y in bar:
        tick = time.perf_counter()
        lr = schedule(*clock.position(step, schedule.total_steps, test_batches))
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast or nullcontext():
            loss = train_step(model, x, y, optimizer, label_smoothing, scaler)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {step} (lr {lr:.2e})")
        losses.append(loss)
        clock.record_step(time.perf_counter() - tick)
        step += 1
        if on_step is not None:
            on_step()
        if len(losses) % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / 10:.3f}", lr=f"{lr:.1e}", refresh=False)  # shown at next update
        if clock.left(test_batches) <= 0:
            break
    return losses, lr, step


class Schedule:
    """The per-step learning rate of a run: ``Schedule(...)(step)`` -> lr (warmup, then cosine).

    epochs=None: the run fills a time budget, and the caller passes the total steps it expects at each call.
    """

    def __init__(self, epochs, steps_per_epoch, warmup_epochs, lr, min_lr):
        self.total_steps = None if epochs is None else epochs * steps_per_epoch
        self.warmup_steps, self.lr, self.min_lr = round(warmup_epochs * steps_per_epoch), lr, min_lr

    def __call__(self, step, total_steps=None):
        total = self.total_steps if total_steps is None else total_steps
        total = math.inf if total is None else total  # pace not known yet: warmup, then the decay not yet begun
        return warmup_cosine(min(step, total - 1), total, self.warmup_steps, self.lr, self.min_lr)


def fit(model, train_loader, test_loader, *, epochs, lr, weight_decay, warmup_epochs, label_smoothing,
        min_lr=0.0, device=None, amp="auto", time_budget=None, checkpoint=None, resume=False, seed=0,
        progress=True, on_step=None, run_info=None, test_flips=False):
    """Train ``model`` with AdamW and a per-step warmup-cosine schedule; evaluate after every epoch.

    Args:
        train_loader, test_loader: iterables of (x (b, C, H, W), y (b,)) with a len(); a loader with
            ``set_epoch`` (``batches.DeviceLoader``) is told the epoch when resuming
        epochs, lr, weight_decay, warmup_epochs (may be fractional), label_smoothing, min_lr: the recipe;
            epochs=None (with a time_budget) trains until the budget is used, however many epochs that is
        device: None picks CUDA, then MPS, then the CPU; amp: see ``precision.amp_dtype`` and ``precision.resolve_amp``
        time_budget: seconds for the training and its final evaluation; when they run out, the epoch stops
            and the model is evaluated. The schedule then follows the clock too, so a budget-cut run still
            ends with a decayed learning rate. Runs the budget does not cut are exactly reproducible.
        checkpoint: a path, written atomically after every epoch (config, weights, optimizer, history, rng);
            with ``resume=True`` and that file present, training continues after its last epoch
        on_step: called with no arguments after every step (e.g. a ``device.ThreadWatch``)
        run_info: a dict of plain values stored in the checkpoint too (e.g. the recipe's name and settings)
        test_flips: the last evaluation also averages each image with its mirror (``train.evaluate_flips``)
    Returns the history: dict of lists epoch, train_loss, test_loss, test_acc (one view), lr, seconds (cumulative);
    with test_flips also flip_acc, the last evaluation's accuracy with flips (a number).
    KeyboardInterrupt: the model is left in eval mode with the weights of the last step, the checkpoint
    file keeps the last finished epoch, and the interrupt is re-raised.
    """
    device = pick_device(device)
    model.to(device)
    dtype, _ = resolve_amp(amp, device, model, test_loader, progress)
    autocast, scaler = amp_settings(dtype or "off", device)
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr)
    if epochs is None and time_budget is None:
        raise ValueError("epochs=None trains until the time budget is used: give a time_budget, or a number of epochs")
    schedule = Schedule(epochs, len(train_loader), warmup_epochs, lr, min_lr)
    torch.manual_seed(seed)  # dropout and stochastic depth draw from the global generator
    history, start, step, spent = _start(checkpoint if resume else None, model, optimizer, train_loader, progress)
    clock = Clock(time_budget, spent, final_passes=2 if test_flips else 1)
    try:
        for epoch in itertools.count(start) if epochs is None else range(start, epochs):
            losses, current_lr, step = _train_epoch(
                model, train_loader, optimizer, schedule, clock, step, label_smoothing=label_smoothing,
                autocast=autocast, scaler=scaler, desc=f"epoch {epoch + 1}/{epochs or '(budget)'}", progress=progress,
                on_step=on_step, test_batches=len(test_loader))
            last = epoch + 1 == epochs or clock.left(len(test_loader)) <= 0
            test_loss, test_acc = _evaluate_timed(model, test_loader, autocast, clock, history, test_flips and last)
            done = epoch + len(losses) / len(train_loader)  # fractional when the budget cut the epoch
            _record(history, epoch=done, train_loss=sum(losses) / max(len(losses), 1), test_loss=test_loss,
                    test_acc=test_acc, lr=current_lr, seconds=clock.elapsed(), progress=progress)
            if checkpoint is not None:
                save_checkpoint(checkpoint, model, history=history, optimizer=optimizer, epoch=epoch + 1, step=step,
                                seconds=history["seconds"][-1], rng=torch.get_rng_state(), **(run_info or {}))
            if last or clock.left(len(test_loader)) <= 0:
                break
    except KeyboardInterrupt:
        model.eval()
        if progress:
            tqdm.write(f"interrupted; the last finished epoch is in {checkpoint}" if checkpoint else "interrupted")
        raise
    if test_flips:
        _finish_flips(history, model, test_loader, autocast, clock, progress)
    model.eval()
    return history


def _start(checkpoint, model, optimizer, train_loader, progress):
    """-> (history, epoch, step, seconds) of a fresh run, or of the run in ``checkpoint`` (None: fresh) if it
    exists, loaded into model and optimizer; the loader (refused if empty) is told the epoch it starts at."""
    _check_not_empty(train_loader)
    history, start, step, spent = {key: [] for key in HISTORY_KEYS}, 0, 0, 0.0
    if checkpoint is not None and Path(checkpoint).is_file():
        history, start, step, spent = _resume(checkpoint, model, optimizer, progress)
    if hasattr(train_loader, "set_epoch"):
        train_loader.set_epoch(start)
    return history, start, step, spent


def _finish_flips(history, model, test_loader, autocast, clock, progress):
    """history["flip_acc"], evaluated now if the last epoch's evaluation did not know it was the last (the
    budget ran out during it), and printed."""
    if "flip_acc" not in history:
        _evaluate_timed(model, test_loader, autocast, clock, history, flips=True)
    if progress:
        tqdm.write(f"with test-time flips (each image and its mirror): test acc {history['flip_acc']:.2%}")


def _check_not_empty(loader):
    if len(loader) == 0:
        raise ValueError(f"the training loader yields no batch: {len(getattr(loader, 'labels', ()))} images "
                         f"with batch size {getattr(loader, 'batch_size', '?')} (drop_last drops an incomplete batch)")


def _evaluate_timed(model, test_loader, autocast, clock, history, flips=False):
    """``evaluate`` (``evaluate_flips`` with flips, whose accuracy goes to history["flip_acc"]) under autocast if
    any, the seconds of one pass recorded on the clock: -> (test loss, test accuracy), one view."""
    tick = time.perf_counter()
    with autocast or nullcontext():
        test_loss, test_acc, *flip_acc = evaluate_flips(model, test_loader) if flips else evaluate(model, test_loader)
    clock.eval_seconds = (time.perf_counter() - tick) / (2 if flips else 1)
    if flips:
        history["flip_acc"] = round(flip_acc[0], 6)
    return test_loss, test_acc


def _record(history, *, progress, **values):
    """Append one epoch's values (rounded floats) to the history, and print a line."""
    for key in HISTORY_KEYS:
        value = values[key]
        history[key].append(round(value, 6) if isinstance(value, float) else value)
    if progress:
        tqdm.write(f"epoch {values['epoch']:.2f}: train loss {values['train_loss']:.4f}, test loss "
                   f"{values['test_loss']:.4f}, test acc {values['test_acc']:.2%}, {values['seconds']:.0f} s")


__all__ = ["Clock", "Schedule", "fit"]
