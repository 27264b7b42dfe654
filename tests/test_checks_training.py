"""The chapter 06-08 checks (training step, evaluation, schedule, augmentation, interpretability) catch mistakes."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from vit_course import checks, data, interpret, train

from .check_helpers import accepts, rejects

# --- train_step ----------------------------------------------------------------------------------------------

def step(train_mode=True, zero_grad="before", smoothing=True, softmax=False, item=True):
    def train_step(model, images, labels, optimizer, label_smoothing=0.0):
        if train_mode:
            model.train()
        if zero_grad == "before":
            optimizer.zero_grad()
        logits = model(images)
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

def evaluation(eval_mode=True, no_grad=True, per_batch=False, percent=False):
    def evaluate(model, batches):
        if eval_mode:
            model.eval()
        losses, correct, count = [], 0, 0
        with torch.set_grad_enabled(not no_grad):
            for x, y in batches:
                logits = model(x)
                losses.append(F.cross_entropy(logits, y).item() if per_batch else
                              F.cross_entropy(logits, y, reduction="sum").item())
                correct += (logits.argmax(-1) == y).sum().item()
                count += len(y)
        loss = sum(losses) / len(losses) if per_batch else sum(losses) / count
        return loss, 100 * correct / count if percent else correct / count
    return evaluate


@torch.inference_mode()
def evaluate_inference_mode(model, batches):
    model.eval()
    logits = [model(x) for x, _ in batches]
    labels = torch.cat([y for _, y in batches])
    logits = torch.cat(logits)
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
              use_generator=True):
    def random_crop_flip(images, padding=4, flip=True, generator=None):
        b, _, h, w = images.shape
        gen = generator if use_generator else None
        padded = F.pad(images.float(), (padding,) * 4, mode=pad_mode).to(images.dtype) if padding else images
        high = 2 * padding + (0 if high_exclusive else 1)
        dy, dx = (torch.randint(high, (1 if same_offset else b,), generator=gen).expand(b) for _ in range(2))
        coins = torch.rand(1 if batch_flip else b, generator=gen).expand(b) < 0.5
        out = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(b)])
        if flip:
            out = torch.where(coins[:, None, None, None], out.flip(-2 if vertical else -1), out)
        return out
    return random_crop_flip


def crop_flip_inplace(images, padding=4, flip=True, generator=None):
    out = data.random_crop_flip(images, padding, flip, generator)
    images.copy_(out)
    return images


def crop_flip_float(images, padding=4, flip=True, generator=None):
    return data.random_crop_flip(images.float(), padding, flip, generator)


@pytest.mark.parametrize("impl, hint", [
    (crop_flip(pad_mode="reflect"), "not zeros"), (crop_flip(same_offset=True), "same vertical shift"),
    (crop_flip(high_exclusive=True), "upper bound is exclusive"), (crop_flip(vertical=True), "upside down"),
    (crop_flip(batch_flip=True), "one coin per sample"), (crop_flip(use_generator=False), "generator"),
    (crop_flip_inplace, "in place"), (crop_flip_float, "dtype torch.float32, expected torch.uint8"),
    (lambda images, padding=4, flip=True, generator=None: images, "no sample"),
])
def test_random_crop_flip_rejects(impl, hint):
    rejects(checks.random_crop_flip, impl, hint)


@pytest.mark.parametrize("impl", [data.random_crop_flip, crop_flip()])
def test_random_crop_flip_accepts(impl, capsys):
    accepts(checks.random_crop_flip, impl, capsys)


# --- attention_rollout ---------------------------------------------------------------------------------------

def rollout(identity=True, renorm=True, first_left=False, heads=lambda a: a.mean(1)):
    def attention_rollout(attentions):
        result = torch.eye(attentions[0].shape[-1])
        for a in attentions:
            a = heads(a)
            a = a + torch.eye(a.shape[-1]) if identity else a
            a = a / a.sum(-1, keepdim=True) if renorm else a
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
    result = None
    for a in attentions:
        a = 0.5 * a.mean(1) + 0.5 * torch.eye(a.shape[-1])  # rows already sum to 1
        result = a if result is None else torch.einsum("bij,bjk->bik", a, result)
    return result


@pytest.mark.parametrize("impl", [interpret.attention_rollout, rollout(), rollout_einsum])
def test_rollout_accepts(impl, capsys):
    accepts(checks.attention_rollout, impl, capsys)


# --- mean_attention_distance ---------------------------------------------------------------------------------

def distance(unit_pixels=True, renorm=False, drop_cls=True, manhattan=False):
    def mean_attention_distance(attention, grid_size, patch_size):
        gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
        k = attention.shape[-1] - gh * gw if drop_cls else 0
        a = attention[:, :, k:, k:]
        a = a / a.sum(-1, keepdim=True) if renorm else a
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        centres = (torch.stack([ys.flatten(), xs.flatten()], -1) + 0.5) * (patch_size if unit_pixels else 1)
        d = torch.cdist(centres.float(), centres.float(), p=1.0 if manhattan else 2.0)
        return (a * d).sum(-1).mean((0, 2))
    return mean_attention_distance


@pytest.mark.parametrize("impl, hint", [
    (distance(unit_pixels=False), "in patches, not pixels"), (distance(renorm=True), "renormalised"),
    (distance(drop_cls=False), "raised"), (distance(manhattan=True), "city-block"),
])
def test_distance_rejects(impl, hint):
    rejects(checks.mean_attention_distance, impl, hint)


@pytest.mark.parametrize("impl", [interpret.mean_attention_distance, distance()])
def test_distance_accepts(impl, capsys):
    accepts(checks.mean_attention_distance, impl, capsys)


# --- position_embedding_similarity ---------------------------------------------------------------------------

def similarity(normalise=True, drop_cls=True, on_grid=True):
    def position_embedding_similarity(pos_embed, grid_size):
        gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
        table = pos_embed.reshape(-1, pos_embed.shape[-1])
        table = table[len(table) - gh * gw:] if drop_cls else table
        table = F.normalize(table, dim=-1) if normalise else table
        sim = table @ table.T
        return rearrange(sim, "(a b) (c d) -> a b c d", a=gh, b=gw, c=gh, d=gw) if on_grid else sim
    return position_embedding_similarity


@pytest.mark.parametrize("impl, hint", [
    (similarity(normalise=False), "dot products"), (similarity(on_grid=False), "lay the"),
    (similarity(drop_cls=False), "raised"),
])
def test_similarity_rejects(impl, hint):
    rejects(checks.position_embedding_similarity, impl, hint)


@pytest.mark.parametrize("impl", [interpret.position_embedding_similarity, similarity()])
def test_similarity_accepts(impl, capsys):
    accepts(checks.position_embedding_similarity, impl, capsys)
