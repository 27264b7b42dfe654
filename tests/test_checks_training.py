"""The chapter 06-08 checks (training step, evaluation, schedule, augmentation, interpretability) catch mistakes."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import vit_course
from vit_course import batches, checks, interpret, train
from vit_course.checks import CheckFailed

from .check_helpers import accepts, rejects, slip

check_attention = getattr(interpret, "check_attention", None) or interpret._check_attention  # renamed

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


# --- attention_rollout ---------------------------------------------------------------------------------------

def rollout(identity=True, renorm=True, first_left=False, heads=lambda a: a.mean(1), axis=-1, keep_dtype=False,
            validate=True):
    def attention_rollout(attentions):
        if validate:
            if not attentions:
                raise ValueError("no layers")
            for i, a in enumerate(attentions):
                check_attention(a, f"attentions[{i}]")
                if a.shape[-1] != attentions[0].shape[-1]:
                    raise ValueError(f"attentions[{i}] has {a.shape[-1]} tokens")
        dtype = attentions[0].dtype if keep_dtype else torch.float32
        result = torch.eye(attentions[0].shape[-1], dtype=dtype)
        for a in attentions:
            a = heads(a.to(dtype))
            a = a + torch.eye(a.shape[-1], dtype=dtype) if identity else a
            a = a / a.sum(axis, keepdim=True) if renorm else a
            result = result @ a if first_left else a @ result
        return result
    return attention_rollout


@pytest.mark.parametrize("impl, hint", [
    (rollout(identity=False), "identity"), (rollout(renorm=False), "renormalised"),
    (rollout(first_left=True), "wrong order"), (rollout(heads=lambda a: a.amax(1)), "max"),
    (rollout(heads=lambda a: a), r"\(b, n, n\)"),
])
def test_rollout_rejects(impl, hint):
    rejects(checks.attention_rollout, impl, hint)


def rollout_einsum(attentions):
    if not attentions or any(a.ndim != 4 or a.shape[-1] != attentions[0].shape[-1] for a in attentions):
        raise ValueError("attentions must be a non-empty list of (b, h, n, n) weights of one n")
    result = None
    for a in attentions:
        a = a.float()
        a = 0.5 * a.mean(1) + 0.5 * torch.eye(a.shape[-1])  # rows already sum to 1
        result = a if result is None else torch.einsum("bij,bjk->bik", a, result)
    return result


@pytest.mark.parametrize("impl", [vit_course.attention_rollout, rollout(), rollout_einsum])
def test_rollout_accepts(impl, capsys):
    accepts(checks.attention_rollout, impl, capsys)


# --- mean_attention_distance ---------------------------------------------------------------------------------

def distance(unit_pixels=True, renorm=True, drop_cls=True, manhattan=False, swap_patch=False, validate=True):
    def mean_attention_distance(attention, grid_size, patch_size):
        gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
        if validate and (attention.ndim != 4 or attention.shape[-1] < gh * gw):
            raise ValueError(f"attention {tuple(attention.shape)} does not fit a {gh}x{gw} grid")
        k = attention.shape[-1] - gh * gw if drop_cls else 0
        a = attention[:, :, k:, k:]
        a = a / a.sum(-1, keepdim=True) if renorm else a
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        size = torch.tensor((patch_size, patch_size) if isinstance(patch_size, int) else patch_size)
        size = size.flip(0) if swap_patch else size
        centres = (torch.stack([ys.flatten(), xs.flatten()], -1) + 0.5) * (size if unit_pixels else 1)
        d = torch.cdist(centres.float(), centres.float(), p=1.0 if manhattan else 2.0)
        return (a * d).sum(-1).mean((0, 2))
    return mean_attention_distance


@pytest.mark.parametrize("impl, hint", [
    (distance(unit_pixels=False), "in patches, not pixels"),
    (distance(renorm=False), "divide each query's patch weights"),
    (distance(drop_cls=False), "raised"), (distance(manhattan=True), "city-block"),
])
def test_distance_rejects(impl, hint):
    rejects(checks.mean_attention_distance, impl, hint)


@pytest.mark.parametrize("impl", [vit_course.mean_attention_distance, distance()])
def test_distance_accepts(impl, capsys):
    accepts(checks.mean_attention_distance, impl, capsys)


# --- position_embedding_similarity ---------------------------------------------------------------------------

def similarity(normalise=True, drop_cls=True, on_grid=True, detach=True, to_float=True, axis=-1, validate=True):
    def position_embedding_similarity(pos_embed, grid_size):
        gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
        if validate and ((pos_embed.ndim == 3 and len(pos_embed) != 1) or pos_embed.shape[-2] < gh * gw):
            raise ValueError(f"pos_embed {tuple(pos_embed.shape)} does not fit a {gh}x{gw} grid")
        table = pos_embed.reshape(-1, pos_embed.shape[-1])
        table = table.detach() if detach else table
        table = table.float() if to_float else table
        table = table[len(table) - gh * gw:] if drop_cls else table
        table = F.normalize(table, dim=axis) if normalise else table
        sim = table @ table.T
        return rearrange(sim, "(a b) (c d) -> a b c d", a=gh, b=gw, c=gh, d=gw) if on_grid else sim
    return position_embedding_similarity


@pytest.mark.parametrize("impl, hint", [
    (similarity(normalise=False), "dot products"), (similarity(on_grid=False), "lay the"),
    (similarity(drop_cls=False), "raised"),
])
def test_similarity_rejects(impl, hint):
    rejects(checks.position_embedding_similarity, impl, hint)


@pytest.mark.parametrize("impl", [vit_course.position_embedding_similarity, similarity()])
def test_similarity_accepts(impl, capsys):
    accepts(checks.position_embedding_similarity, impl, capsys)


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


@pytest.mark.parametrize("impl, hint", [
    (rollout(axis=-2), "renormalised over the wrong axis"),
    (rollout(keep_dtype=True), "float16 weights gave a torch.float16 rollout, expected float32"),
    (rollout(validate=False), "an empty list of layers: expected a ValueError, your code raised IndexError"),
])
def test_rollout_rejects_more(impl, hint):
    rejects(checks.attention_rollout, impl, hint)


@pytest.mark.parametrize("impl, hint", [
    (distance(swap_patch=True), r"height and width are swapped: patch_size is \(Ph, Pw\)"),
    (distance(validate=False), r"without a head axis: expected a ValueError"),
])
def test_distance_rejects_more(impl, hint):
    rejects(checks.mean_attention_distance, impl, hint)


@pytest.mark.parametrize("impl, hint", [
    (similarity(detach=False), r"still requires grad(.|\n)*\.detach\(\)"),
    (similarity(to_float=False), "a float16 table gave torch.float16 similarities"),
    (similarity(axis=0), "normalised over the wrong axis"),
    (similarity(validate=False), r"shape \(2, 10, 8\): the first axis must be 1: expected a ValueError"),
])
def test_similarity_rejects_more(impl, hint):
    rejects(checks.position_embedding_similarity, impl, hint)


# --- delete_patches (chapter 08's deletion test) -----------------------------------------------------------------

def deleting(lowest=False, order="h w", count=round, batch_wide=False, in_place=False, fill=0.0, pixels=False):
    """delete_patches as a learner might write it, with one slip switched on."""
    def delete_patches(images, ranking, fraction, patch_size):
        b, _, h, w = images.shape
        gh, gw = h // patch_size, w // patch_size
        if ranking.shape != (b, gh * gw):
            raise ValueError(f"ranking {tuple(ranking.shape)} is not (batch, patches) = {(b, gh * gw)}")
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction {fraction} is not in [0, 1]")
        k = count(fraction * gh * gw)
        keep = torch.ones(b, gh * gw)
        if batch_wide:
            keep.view(-1)[ranking.flatten().topk(k * b, largest=not lowest).indices] = 0.0
        else:
            keep.scatter_(1, ranking.topk(k, dim=1, largest=not lowest).indices, 0.0)
        pattern = "b (h w) -> b h w" if order == "h w" else "b (w h) -> b h w"
        grid = rearrange(keep, pattern, h=gh)
        if pixels:
            mask = torch.ones(b, h, w)
            mask[:, :gh, :gw] = grid
        else:
            mask = grid.repeat_interleave(patch_size, 1).repeat_interleave(patch_size, 2)
        mask = mask[:, None].bool()
        if in_place:
            images.masked_fill_(~mask, fill)
            return images
        return torch.where(mask, images, torch.full_like(images, fill))
    return delete_patches


@pytest.mark.parametrize("impl, hint", [
    (deleting(lowest=True), "ranked lowest"), (deleting(order="w h"), "column by column"),
    (deleting(pixels=True), "pixel positions"), (deleting(count=int), r"int\(\) rounds down"),
    (deleting(batch_wide=True), "whole batch"), (deleting(in_place=True), "in place"),
    (deleting(fill=-1.0), "dataset's mean colour"),
    (lambda images, ranking, fraction, patch_size: images.clone(), "largest difference"),
])
def test_delete_patches_rejects(impl, hint):
    rejects(checks.delete_patches, impl, hint)


@pytest.mark.parametrize("impl", [vit_course.delete_patches, deleting()])
def test_delete_patches_accepts(impl, capsys):
    accepts(checks.delete_patches, impl, capsys)


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
