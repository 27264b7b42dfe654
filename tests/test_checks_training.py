"""The chapter 06-07 checks (training step, evaluation, schedule, augmentation) catch mistakes; chapter 08's are in
test_checks_interpret.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from vit_course import batches, checks, train
from vit_course.checks import CheckFailed

from .check_helpers import accepts, rejects, slip

# --- train_step ----------------------------------------------------------------------------------------------

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


# --- evaluate ------------------------------------------------------------------------------------------------

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


# --- warmup_cosine -------------------------------------------------------------------------------------------

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


# --- random_crop_flip ----------------------------------------------------------------------------------------

def crop_flip(pad_mode="constant", same_offset=False, high_exclusive=False, vertical=False, batch_flip=False,
              use_generator=True, shared_offset=False, validate=True, loop=False):
    def random_crop_flip(images, padding=4, flip=True, generator=None):
        if validate and (images.ndim != 4 or padding < 0):
            raise ValueError(f"bad images {tuple(images.shape)} or padding {padding}")
        b, _, h, w = images.shape
        gen = generator if use_generator else None
        padded = F.pad(images.float(), (padding,) * 4, mode=pad_mode).to(images.dtype) if padding else images
        high = 2 * padding + (0 if high_exclusive else 1)
        dy, dx = (torch.randint(high, (1 if same_offset else b,), generator=gen).expand(b) for _ in range(2))
        dx = dy if shared_offset else dx
        coins = torch.rand(1 if batch_flip else b, generator=gen).expand(b) < 0.5
        rows, cols = dy[:, None] + torch.arange(h), dx[:, None] + torch.arange(w)  # (b, H), (b, W)
        if loop:
            out = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(b)])
        else:  # advanced indexing, all samples at once
            out = padded[torch.arange(b)[:, None, None, None], torch.arange(images.shape[1])[None, :, None, None],
                         rows[:, None, :, None], cols[:, None, None, :]]
        if flip:
            out = torch.where(coins[:, None, None, None], out.flip(-2 if vertical else -1), out)
        return out
    return random_crop_flip


def crop_flip_inplace(images, padding=4, flip=True, generator=None):
    out = batches.random_crop_flip(images, padding, flip, generator)
    images.copy_(out)
    return images


def crop_flip_float(images, padding=4, flip=True, generator=None):
    return batches.random_crop_flip(images.float(), padding, flip, generator)


@pytest.mark.parametrize("impl, hint", [
    (crop_flip(pad_mode="reflect"), "not zeros"), (crop_flip(same_offset=True), "same vertical shift"),
    (crop_flip(high_exclusive=True), "upper bound is exclusive"), (crop_flip(vertical=True), "upside down"),
    (crop_flip(batch_flip=True), "one coin per sample"), (crop_flip(use_generator=False), "generator"),
    (crop_flip_inplace, "in place"), (crop_flip_float, "dtype torch.float32, expected torch.uint8"),
    (lambda images, padding=4, flip=True, generator=None: images, "no sample"),
])
def test_random_crop_flip_rejects(impl, hint):
    rejects(checks.random_crop_flip, impl, hint)


@pytest.mark.parametrize("impl", [batches.random_crop_flip, crop_flip()])
def test_random_crop_flip_accepts(impl, capsys):
    accepts(checks.random_crop_flip, impl, capsys)


# --- more slips, each named (issue "The learner's path") ------------------------------------------------------

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


def test_tried_line_is_one_short_line():
    with pytest.raises(CheckFailed) as info:
        checks.train_step(step_with("sum"))
    tried = [line for line in str(info.value).split("\n") if line.startswith("  tried:")]
    assert tried == ["  tried: train_step(Probe, tensor(8, 3, 2, 2), int64 tensor(8,), SGD(lr=0.5, momentum=0.9))"]


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


@pytest.mark.parametrize("impl, hint", [
    (crop_flip(shared_offset=True), "same vertical and horizontal shift"),
    (crop_flip(validate=False), "padding=-1 is negative: expected a ValueError"),
])
def test_random_crop_flip_rejects_more(impl, hint):
    rejects(checks.random_crop_flip, impl, hint)


# --- the catalogue of slips of chapters 06-07 (issue 34), with the rule the check must blame ------------------

def step_normalising(model, images, labels, optimizer, label_smoothing=0.0):
    images -= images.mean()  # "centre the batch first", in the caller's tensor
    return train.train_step(model, images, labels, optimizer, label_smoothing)


def evaluate_normalising(model, batches):
    for x, _ in batches:
        x /= x.abs().max()
    return train.evaluate(model, batches)


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
    slip("random_crop_flip", "output", "reflect", crop_flip(pad_mode="reflect"), "not zeros"),
    slip("random_crop_flip", "output", "upside_down", crop_flip(vertical=True), "upside down"),
    slip("random_crop_flip", "loop", "per_sample", crop_flip(loop=True),
         r"called torch \d+ times for 400 images(.|\n)*a Python loop over the samples"),
    slip("random_crop_flip", "flip", "one_coin", crop_flip(batch_flip=True), "one coin per sample"),
    slip("random_crop_flip", "offsets", "exclusive", crop_flip(high_exclusive=True), "upper bound is exclusive"),
    slip("random_crop_flip", "offsets", "shared", crop_flip(shared_offset=True), "same vertical and horizontal"),
    slip("random_crop_flip", "generator", "ignored", crop_flip(use_generator=False), "generator"),
    slip("random_crop_flip", "error", "no_check", crop_flip(validate=False), "padding=-1 is negative"),
    slip("random_crop_flip", "inputs", "copy_", crop_flip_inplace, "in place"),
]
