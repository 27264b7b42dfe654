"""Training (chapters 06-07): the step, evaluation, the warmup-cosine schedule and ``fit``.

``fit`` is AdamW (no weight decay on norms, biases, tokens and position embeddings), linear warmup then
cosine decay per step, label smoothing, an evaluation after every epoch, progress bars, an optional time
budget, atomic checkpoints after every epoch and resuming from them. Checkpoint files: ``checkpoint.py``.
"""

import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .checkpoint import load_checkpoint, save_checkpoint
from .device import pick_device

NO_DECAY_NAMES = ("cls_token", "pos_embed")


def warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0):
    """Learning rate at ``step``: linear warmup to ``base_lr`` over ``warmup_steps``, then cosine to ``min_lr``."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)  # 0 -> 1 over the decay
    return min_lr + (base_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * t))


def param_groups(model, weight_decay):
    """AdamW parameter groups: decay the weight matrices, not norms, biases, the class token or positions.

    Weight decay pulls parameters toward 0; for a LayerNorm scale or a bias 0 is no sensible prior, and
    decaying them only hurts (1-D tensors). -> [{"params": decayed, "weight_decay": wd}, {..., 0.0}]
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name.split(".")[-1] in NO_DECAY_NAMES:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train_step(model, images, labels, optimizer, label_smoothing=0.0):
    """One optimisation step on a batch: images (b, C, H, W), labels (b,) -> the loss as a float."""
    model.train()
    logits = model(images)  # (b, classes)
    loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _amp_step(model, images, labels, optimizer, label_smoothing, autocast, scaler):
    """``train_step`` under autocast; with a GradScaler (fp16) the loss is scaled so small gradients survive."""
    model.train()
    with autocast:
        logits = model(images)  # (b, classes), in bf16/fp16
    loss = F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)  # the loss in float32
    optimizer.zero_grad()
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
        scaler.update()
    return loss.item()


@torch.no_grad()
def evaluate(model, batches):
    """Mean cross-entropy and accuracy (0..1) of ``model`` over (x, y) batches, in eval mode.

    The model's previous train/eval mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total_loss, correct, count = 0.0, 0, 0
    try:
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            logits = model(x).float()  # (b, classes)
            total_loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(dim=1) == y).sum().item()
            count += len(y)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluate got no batches")
    return total_loss / count, correct / count


def amp_settings(amp, device):
    """(autocast context or None, GradScaler or None) for ``amp`` in "auto", "bf16", "fp16", "off"/None/False.

    "auto": bf16 on CUDA GPUs that support it, else fp16 with a GradScaler; on MPS and the CPU none. On
    this course's reference CPU bf16 autocast was measured slower (no native bf16 matmul; benchmarks/).
    """
    if amp in (None, False, "off", "none"):
        return None, None
    if amp not in ("auto", "bf16", "fp16"):
        raise ValueError(f'amp must be "auto", "bf16", "fp16" or "off", got {amp!r}')
    if amp == "auto":
        if device.type != "cuda":
            return None, None
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" and device.type == "cuda" else None
    return torch.autocast(device.type, dtype=dtype), scaler


def fit(model, train_loader, test_loader, *, epochs, lr, weight_decay, warmup_epochs, label_smoothing,
        device=None, amp="auto", time_budget=None, checkpoint=None, resume=False, seed=0, progress=True,
        min_lr=0.0):
    """Train ``model`` with AdamW and a per-step warmup-cosine schedule; evaluate after every epoch.

    Args:
        train_loader, test_loader: iterables of (x (b, C, H, W), y (b,)) with a len(); a loader with
            ``set_epoch`` (``data.DeviceLoader``) is told the epoch when resuming
        epochs, lr, weight_decay, warmup_epochs (may be fractional), label_smoothing, min_lr: the recipe
        device: None picks CUDA, then MPS, then the CPU; amp: see ``amp_settings``
        time_budget: seconds for the training and its final evaluation (whose time is estimated from the
            last evaluation, or from the step time); when they run out, the epoch stops after the current
            step and the model is evaluated. The schedule then follows the clock too (its progress is the
            larger of steps done and time used), so a budget-cut run still ends with a decayed learning
            rate. Runs that the budget does not cut are exactly reproducible: same seed and machine, same run.
        checkpoint: a path, written atomically after every epoch (config, weights, optimizer, history,
            metrics); with ``resume=True`` and that file present, training continues after its last epoch.
    Returns the history: dict of lists epoch, train_loss, test_loss, test_acc, lr, seconds (cumulative).
    KeyboardInterrupt: the model is left in eval mode with the weights of the last step, the checkpoint
    file keeps the last finished epoch, and the interrupt is re-raised.
    """
    device = pick_device(device)
    model.to(device)
    autocast, scaler = amp_settings(amp, device)
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr)
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        size = len(getattr(train_loader, "labels", ()))
        raise ValueError(f"the training loader yields no batch: {size} images with batch size "
                         f"{getattr(train_loader, 'batch_size', '?')} (drop_last drops an incomplete batch)")
    total_steps, warmup_steps = epochs * steps_per_epoch, round(warmup_epochs * steps_per_epoch)
    history = {k: [] for k in ("epoch", "train_loss", "test_loss", "test_acc", "lr", "seconds")}
    config = getattr(model, "config", {})
    start_epoch, step, spent = 0, 0, 0.0
    torch.manual_seed(seed)  # dropout and stochastic depth draw from the global generator
    if resume and checkpoint is not None and Path(checkpoint).is_file():
        _, state = load_checkpoint(checkpoint, device="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history, start_epoch, step, spent = state["history"], state["epoch"], state["step"], state["seconds"]
        torch.set_rng_state(state["rng"])
        if progress:
            tqdm.write(f"resuming from {checkpoint} after epoch {start_epoch}")
    if hasattr(train_loader, "set_epoch"):
        train_loader.set_epoch(start_epoch)
    evaluate_ctx = autocast or nullcontext()
    started = time.perf_counter() - spent
    eval_seconds, step_seconds = None, 0.0  # measured as we go, so the budget leaves room for the evaluation

    def time_left():  # seconds of the budget left for training steps, the final evaluation set aside
        if eval_seconds is not None:
            reserve = eval_seconds
        else:  # a test batch (forward only) costs about a third of a training step; take half to be safe
            reserve = 0.5 * step_seconds * len(test_loader)
        return time_budget - reserve - (time.perf_counter() - started)

    try:
        for epoch in range(start_epoch, epochs):
            losses, stopped = [], False
            bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, disable=not progress)
            for x, y in bar:
                tick = time.perf_counter()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                virtual = step
                if time_budget is not None:  # follow the clock if it runs out before the steps do
                    used = (time.perf_counter() - started) / max(time.perf_counter() - started + time_left(), 1e-9)
                    virtual = max(step, int(total_steps * used))
                current_lr = warmup_cosine(min(virtual, total_steps - 1), total_steps, warmup_steps, lr, min_lr)
                for group in optimizer.param_groups:
                    group["lr"] = current_lr
                if autocast is None:
                    loss = train_step(model, x, y, optimizer, label_smoothing)
                else:
                    loss = _amp_step(model, x, y, optimizer, label_smoothing, autocast, scaler)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss became {loss} at step {step} (lr {current_lr:.2e})")
                losses.append(loss)
                step_seconds = time.perf_counter() - tick if step_seconds == 0 else (
                    0.9 * step_seconds + 0.1 * (time.perf_counter() - tick))  # a running mean
                step += 1
                if len(losses) % 10 == 0:
                    bar.set_postfix(loss=f"{sum(losses[-10:]) / 10:.3f}", lr=f"{current_lr:.1e}")
                if time_budget is not None and time_left() <= 0:
                    stopped = True
                    break
            tick = time.perf_counter()
            with evaluate_ctx:
                test_loss, test_acc = evaluate(model, test_loader)
            eval_seconds = time.perf_counter() - tick
            done = len(losses) / steps_per_epoch  # < 1 when the time budget cut the epoch
            for key, value in zip(history, (epoch + done, sum(losses) / max(len(losses), 1), test_loss, test_acc,
                                            current_lr, time.perf_counter() - started), strict=True):
                history[key].append(round(value, 6) if isinstance(value, float) else value)
            if progress:
                tqdm.write(f"epoch {epoch + done:.2f}: train loss {history['train_loss'][-1]:.4f}, test loss "
                           f"{test_loss:.4f}, test acc {test_acc:.2%}, {history['seconds'][-1]:.0f} s")
            if checkpoint is not None:
                metrics = {"test_accuracy": test_acc, "test_loss": test_loss, "epochs": history["epoch"][-1],
                           "train_seconds": history["seconds"][-1]}
                save_checkpoint(checkpoint, model, config, history, metrics, optimizer, epoch=epoch + 1,
                                step=step, seconds=history["seconds"][-1], rng=torch.get_rng_state())
            if stopped:
                break
    except KeyboardInterrupt:
        model.eval()
        if progress:
            tqdm.write(f"interrupted; the last finished epoch is in {checkpoint}" if checkpoint else "interrupted")
        raise
    model.eval()
    return history


__all__ = ["amp_settings", "evaluate", "fit", "param_groups", "train_step", "warmup_cosine"]
