"""The check of vit_course/checks/batches.py (chapter 07: random_crop_flip) catches the usual mistakes and accepts
correct variants.
"""

import pytest
import torch
import torch.nn.functional as F

from vit_course import batches, checks

from .check_helpers import accepts, rejects, slip


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
    (crop_flip(high_exclusive=True), r"_randint\(high, ...\) draws 0..high-1"),
    (crop_flip(vertical=True), "upside down"),
    (crop_flip(batch_flip=True), "one coin per sample"), (crop_flip(use_generator=False), "generator"),
    (crop_flip_inplace, "in place"), (crop_flip_float, "dtype torch.float32, expected torch.uint8"),
    (lambda images, padding=4, flip=True, generator=None: images, "no sample"),
])
def test_random_crop_flip_rejects(impl, hint):
    rejects(checks.random_crop_flip, impl, hint)


@pytest.mark.parametrize("impl", [batches.random_crop_flip, crop_flip()])
def test_random_crop_flip_accepts(impl, capsys):
    accepts(checks.random_crop_flip, impl, capsys)


@pytest.mark.parametrize("impl, hint", [
    (crop_flip(shared_offset=True), "same vertical and horizontal shift"),
    (crop_flip(validate=False), "padding=-1 is negative: expected a ValueError"),
])
def test_random_crop_flip_rejects_more(impl, hint):
    rejects(checks.random_crop_flip, impl, hint)


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("random_crop_flip", "output", "reflect", crop_flip(pad_mode="reflect"), "not zeros"),
    slip("random_crop_flip", "output", "upside_down", crop_flip(vertical=True), "upside down"),
    slip("random_crop_flip", "loop", "per_sample", crop_flip(loop=True),
         r"called torch \d+ times for 400 images(.|\n)*a Python loop \(over the samples, or over the offsets\)"),
    slip("random_crop_flip", "flip", "one_coin", crop_flip(batch_flip=True), "one coin per sample"),
    slip("random_crop_flip", "offsets", "exclusive", crop_flip(high_exclusive=True),
         r"_randint\(high, ...\) draws 0..high-1"),
    slip("random_crop_flip", "offsets", "shared", crop_flip(shared_offset=True), "same vertical and horizontal"),
    slip("random_crop_flip", "generator", "ignored", crop_flip(use_generator=False), "generator"),
    slip("random_crop_flip", "error", "no_check", crop_flip(validate=False), "padding=-1 is negative"),
    slip("random_crop_flip", "inputs", "copy_", crop_flip_inplace, "in place"),
]
