"""Training's building blocks (chapter 06): the schedule, parameter groups, one step, and evaluation.

These are chapter 06's exercises; ``vit_course.loop.fit`` puts them together into a training run.
"""

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

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


def train_step(model, images, labels, optimizer, label_smoothing=0.0, scaler=None):
    """One optimisation step on a batch: images (b, C, H, W), labels (b,) -> the batch's mean loss, a 0-dim tensor.

    The loss comes back detached and on the model's device: reading it as a number (``float(loss)``) makes the
    host wait for the device, so the training loop reads it only when a person looks (``fit``: a progress-bar
    refresh, the end of an epoch), and the host stays ahead of a GPU, queueing the next steps.

    scaler: a ``torch.amp.GradScaler`` for float16 mixed precision (``fit`` passes one on GPUs without
    bfloat16): it scales the loss so small gradients survive float16, and skips a step that overflowed.
    """
    model.train()
    logits = model(images)  # (b, classes)
    loss = F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)  # the loss in float32
    optimizer.zero_grad()
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.detach()


@contextmanager
def eval_mode(model):
    """``with eval_mode(model):`` runs the block in eval mode, then restores the mode the model had."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(model, batches):
    """Mean cross-entropy and accuracy (0..1) of ``model`` over (x, y) batches, in eval mode.

    The model's previous train/eval mode is restored afterwards.
    """
    device = next(model.parameters()).device
    total_loss, correct, count = torch.zeros((), device=device), torch.zeros((), device=device), 0
    with eval_mode(model):
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            logits = model(x).float()  # (b, classes)
            total_loss += F.cross_entropy(logits, y, reduction="sum")  # summed on the device: no host read a batch
            correct += (logits.argmax(dim=1) == y).sum()
            count += len(y)
    if count == 0:
        raise ValueError("evaluate got no batches")
    return total_loss.item() / count, correct.item() / count  # the two numbers read once, at the end


class MirrorAverage(nn.Module):
    """``model`` that sees each image twice, as it is and mirrored left-right, and averages the two predictions.

    forward(x (b, C, H, W)) -> (b, classes): the log of the mean of the two views' class probabilities, which
    ``evaluate`` takes as logits (their softmax is that mean, their argmax its most probable class).
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):  # x (b, C, H, W): W, the last axis, is left-right
        views = self.model(x).float().softmax(dim=-1) + self.model(x.flip(-1)).float().softmax(dim=-1)  # (b, classes)
        return (views / 2).log()  # (b, classes)


def evaluate_flips(model, batches):
    """``evaluate``, and the accuracy with each image's class probabilities averaged with its mirror image's.

    A model trained on left-right flips knows both views of a test image; where it is unsure, they disagree, and
    their average decides (test-time augmentation; benchmarks/flip_tta.py measures it). Two more forward passes
    per image, so ``batches`` must be iterable twice. For images whose mirror is the same class (CIFAR-10, not
    digits). -> (mean cross-entropy, accuracy, flip accuracy), the first two of the images as they are.
    """
    loss, accuracy = evaluate(model, batches)
    return loss, accuracy, evaluate(MirrorAverage(model), batches)[1]


__all__ = ["MirrorAverage", "eval_mode", "evaluate", "evaluate_flips", "param_groups", "train_step", "warmup_cosine"]
