"""The checks of vit_course/checks/train.py (chapter 06: train_step, evaluate, warmup_cosine) catch the usual
mistakes and accept correct variants.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from vit_course import checks, train

from .check_helpers import accepts, rejects, slip


def step(train_mode=True, zero_grad="before", smoothing=True, softmax=False, item=True):
    def train_step(model, images, labels, optimizer, label_smoothing=0.0):
        if train_mode:
            model.train()
        if zero_grad == "before":
            optimizer.zero_grad()
        logits = model(images).float()
        logits = logits.softmax(-1) if softmax else logits
        loss = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing if smoothing else 0.0)(logits, labels)
        loss.backward()
        optimizer.step()
        if zero_grad == "after":
            optimizer.zero_grad(set_to_none=False)
        return loss.item() if item else loss
    return train_step


@pytest.mark.parametrize("impl, hint", [
    (step(train_mode=False), "model.train()"), (step(zero_grad=None), "zero_grad"),
    (step(smoothing=False), "label_smoothing is ignored"), (step(softmax=True), "softmax is applied before"),
    (step(item=False), r"\.item\(\)"),
])
def test_train_step_rejects(impl, hint):
    rejects(checks.train_step, impl, hint)


@pytest.mark.parametrize("impl", [train.train_step, step(), step(zero_grad="after")])
def test_train_step_accepts(impl, capsys):
    accepts(checks.train_step, impl, capsys)


def evaluation(eval_mode=True, no_grad=True, per_batch=False, percent=False, restore="mode", empty="raise"):
    def evaluate(model, batches):
        was_training = model.training
        if eval_mode:
            model.eval()
        if restore == "len":
            len(batches)
        losses, correct, count = [], 0, 0
        with torch.set_grad_enabled(not no_grad):
            for x, y in batches:
                logits = model(x)
                losses.append(F.cross_entropy(logits, y).item() if per_batch else
                              F.cross_entropy(logits, y, reduction="sum").item())
                correct += (logits.argmax(-1) == y).sum().item()
                count += len(y)
        if restore in ("mode", "len"):
            model.train(was_training)
        elif restore == "train":
            model.train()
        if count == 0 and empty == "raise":
            raise ValueError("no batches")
        loss = sum(losses) / len(losses) if per_batch else sum(losses) / count
        return loss, 100 * correct / count if percent else correct / count
    return evaluate


@torch.inference_mode()
def evaluate_inference_mode(model, batches):
    was_training = model.training
    model.eval()
    pairs = [(model(x), y) for x, y in batches]  # one pass: batches may be a generator
    model.train(was_training)
    if not pairs:
        raise ValueError("evaluate needs at least one batch")
    logits, labels = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    return F.cross_entropy(logits, labels).item(), (logits.argmax(1) == labels).float().mean().item()


@pytest.mark.parametrize("impl, hint", [
    (evaluation(eval_mode=False), r"model\.eval\(\)"), (evaluation(no_grad=False), "no_grad"),
    (evaluation(per_batch=True), "mean of the batch means"), (evaluation(percent=True), "percentage"),
])
def test_evaluate_rejects(impl, hint):
    rejects(checks.evaluate, impl, hint)


@pytest.mark.parametrize("impl", [train.evaluate, evaluation(), evaluate_inference_mode])
def test_evaluate_accepts(impl, capsys):
    accepts(checks.evaluate, impl, capsys)


def schedule(off_by_one=False, use_min=True, offset=True, cosine=True):
    def warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0):
        if step < warmup_steps:
            return base_lr * (step if off_by_one else step + 1) / warmup_steps
        t = (step - warmup_steps if offset else step) / max(1, total_steps - warmup_steps)
        low = min_lr if use_min else 0.0
        return low + (base_lr - low) * (0.5 * (1 + math.cos(math.pi * t)) if cosine else 1 - t)
    return warmup_cosine


@pytest.mark.parametrize("impl, hint", [
    (schedule(off_by_one=True), "off by one"), (schedule(use_min=False), "ends at 0, not min_lr"),
    (schedule(cosine=False), "linearly"), (lambda *a, **k: torch.tensor(train.warmup_cosine(*a, **k)), r"\.item"),
])
def test_warmup_cosine_rejects(impl, hint):
    rejects(checks.warmup_cosine, impl, hint)


@pytest.mark.parametrize("impl", [train.warmup_cosine, schedule()])
def test_warmup_cosine_accepts(impl, capsys):
    accepts(checks.warmup_cosine, impl, capsys)


def step_with(slip):
    def train_step(model, images, labels, optimizer, label_smoothing=0.0):
        model.train()
        optimizer.zero_grad()
        reduction = "sum" if slip == "sum" else "mean"
        logits = model(images) if slip == "low_precision" else model(images).float()
        loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction=reduction)
        loss.backward()
        if slip == "zero_between":
            optimizer.zero_grad()
        optimizer.step()
        return loss.item()
    return train_step


@pytest.mark.parametrize("impl, hint", [
    (step_with("sum"), "this is the sum of the samples' losses"),
    (step_with("zero_between"), r"weights have not changed(.|\n)*zero_grad\(\) between backward\(\) and step\(\)"),
])
def test_train_step_rejects_more(impl, hint):
    rejects(checks.train_step, impl, hint)


@pytest.mark.parametrize("impl, hint", [
    (evaluation(restore=None), "came in training mode and evaluate left it in eval mode(.|\n)*model.train"
                               r"\(was_training\)"),
    (evaluation(restore="train"), "came in eval mode and evaluate left it in training mode"),
    (evaluation(restore="len"), r"has no len\(\)(.|\n)*go through them once"),
    (evaluation(empty=None), "no batches at all: expected a ValueError, your code raised ZeroDivisionError"),
])
def test_evaluate_rejects_more(impl, hint):
    rejects(checks.evaluate, impl, hint)


def schedule_with(slip):
    def warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0):
        if step < warmup_steps:
            if slip == "warmup+1":
                return base_lr * (step + 1) / (warmup_steps + 1)
            rise = (step + 1) / warmup_steps
            return min_lr + (base_lr - min_lr) * rise if slip == "from_min" else base_lr * rise
        span = total_steps - warmup_steps - (1 if slip == "end-1" else 0)
        t = min(1.0, (step - warmup_steps) / max(1, span)) if slip == "end-1" else (step - warmup_steps) / max(1, span)
        return min_lr + (base_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * t))
    return warmup_cosine


@pytest.mark.parametrize("slip, hint", [
    ("warmup+1", r"divides by warmup_steps \+ 1"), ("from_min", "the warmup starts from min_lr"),
    ("end-1", "reaches min_lr one step early"),
])
def test_warmup_cosine_rejects_more(slip, hint):
    rejects(checks.warmup_cosine, schedule_with(slip), hint)


def step_normalising(model, images, labels, optimizer, label_smoothing=0.0):
    images -= images.mean()  # "centre the batch first", in the caller's tensor
    return train.train_step(model, images, labels, optimizer, label_smoothing)


def evaluate_normalising(model, batches):
    for x, _ in batches:
        x /= x.abs().max()
    return train.evaluate(model, batches)


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("train_step", "train-mode", "no_train", step(train_mode=False), r"model\.train\(\)"),
    slip("train_step", "loss", "no_smoothing", step(smoothing=False), "label_smoothing is ignored"),
    slip("train_step", "loss", "softmax", step(softmax=True), "softmax is applied before"),
    slip("train_step", "loss", "tensor", step(item=False), r"\.item\(\)"),
    slip("train_step", "float32", "low_precision", step_with("low_precision"),
         r"bfloat16 logits(.|\n)*compute it in float32, F.cross_entropy\(logits.float\(\)"),
    slip("train_step", "step", "no_zero_grad", step(zero_grad=None), "zero_grad"),
    slip("train_step", "step", "zero_between", step_with("zero_between"), r"zero_grad\(\) between backward"),
    slip("train_step", "inputs", "centred", step_normalising, "changed its input `images` in place"),
    slip("evaluate", "output", "batch_means", evaluation(per_batch=True), "mean of the batch means"),
    slip("evaluate", "output", "percent", evaluation(percent=True), "percentage"),
    slip("evaluate", "batches", "len", evaluation(restore="len"), r"has no len\(\)"),
    slip("evaluate", "eval-mode", "no_eval", evaluation(eval_mode=False), r"model\.eval\(\)"),
    slip("evaluate", "no-grad", "grad", evaluation(no_grad=False), "no_grad"),
    slip("evaluate", "restore", "not_restored", evaluation(restore=None), "left it in eval mode"),
    slip("evaluate", "error", "zero_division", evaluation(empty=None), "raised ZeroDivisionError"),
    slip("evaluate", "inputs", "normalised", evaluate_normalising, "changed its input `batches` in place"),
    slip("warmup_cosine", "output", "off_by_one", schedule(off_by_one=True), "off by one"),
    slip("warmup_cosine", "output", "linear", schedule(cosine=False), "linearly"),
]
