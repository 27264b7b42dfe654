"""RandAugment, CutMix and Mixup (vit_course.augment): batched, seeded, labels mixed as the pixels are."""

import itertools

import pytest
import torch

from vit_course.augment import GEOMETRIC, OPS, _colour_op, _geometric_op, cutmix_box, mix_batch, rand_augment
from vit_course.batches import DeviceLoader
from vit_course.train import train_step


def images(b=16, c=3, side=32, seed=0):
    return torch.randint(0, 256, (b, c, side, side), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_rand_augment_is_seeded_batched_uint8():
    x = images()
    a = rand_augment(x, torch.Generator().manual_seed(1), num_ops=2, magnitude=9)
    b = rand_augment(x, torch.Generator().manual_seed(1), num_ops=2, magnitude=9)
    c = rand_augment(x, torch.Generator().manual_seed(2), num_ops=2, magnitude=9)
    assert a.dtype == torch.uint8 and a.shape == x.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(rand_augment(x, None, num_ops=0), x)
    assert torch.equal(rand_augment(x, None, num_ops=2, prob=0.0), x)
    x = images(1000) // 2 + 60  # values 60..187: every op but the identity changes such an image
    for prob, share in ((1.0, 1 - (1 / len(OPS)) ** 2), (0.5, 1 - (0.5 + 0.5 / len(OPS)) ** 2)):
        changed = (rand_augment(x, torch.Generator().manual_seed(3), 2, 9, prob) != x).flatten(1).any(1)
        assert changed.float().mean().item() == pytest.approx(share, abs=0.05), prob  # images any op changed


@pytest.mark.parametrize("name", [op for op in OPS if op not in ("identity", "auto_contrast")])
def test_every_op_acts_at_magnitude_9_and_is_the_identity_at_0(name):
    x = images(8).float() / 255
    op = _geometric_op if name in GEOMETRIC else _colour_op
    strong = op(name, x, 0.9, torch.Generator().manual_seed(0)).clamp(0, 1)
    weak = op(name, x, 0.0, torch.Generator().manual_seed(0))
    assert (strong - x).abs().mean() > 0.02, name
    assert torch.allclose(weak, x, atol=1e-5), name


def _luma(x):
    """ITU-R 601 luma, written out here rather than taken from the module under test: (b, 3, H, W) -> (b, 1, H, W)."""
    return (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)


def _per_image_factor(out, x, reference):
    """The f with out = reference + f (x - reference), image by image (b,), and whether it fits every pixel."""
    f = ((out - reference) * (x - reference)).flatten(1).sum(1) / ((x - reference) ** 2).flatten(1).sum(1)
    return f, torch.allclose(out, reference + f.view(-1, 1, 1, 1) * (x - reference), atol=1e-5)


def test_each_colour_op_does_what_its_name_says():
    """At magnitude 0.5 the blend factor is 1 - 0.45 or 1 + 0.45 per image (PIL's ImageEnhance), towards or away
    from: black (brightness), the image's mean luma (contrast), each pixel's luma (colour)."""
    x, m, two = images(8).float() / 255, 0.5, {0.55, 1.45}
    op = lambda name, images=x: _colour_op(name, images, m, torch.Generator().manual_seed(0))  # noqa: E731
    for name, reference in [("brightness", torch.zeros_like(x)), ("contrast", _luma(x).mean((1, 2, 3), keepdim=True)),
                            ("colour", _luma(x))]:
        f, fits = _per_image_factor(op(name), x, reference)
        assert fits and {round(v, 4) for v in f.tolist()} == two, (name, f)
    grey = _luma(x).expand(-1, 3, -1, -1)  # a grey image has no colour to change
    assert torch.allclose(op("colour", grey), grey, atol=1e-6) and not torch.allclose(op("contrast", grey), grey)
    posterized = op("posterize") * 255  # round(4 * 0.5) = 2 bits dropped: multiples of 4
    assert torch.allclose(posterized, (posterized / 4).round() * 4, atol=1e-3) and (posterized % 4 < 1e-3).all()
    high = (x * 255).round() >= 128  # solarize at 0.5: the values from 128 up inverted, the rest kept
    assert high.any() and (~high).any()
    assert torch.equal(op("solarize"), torch.where(high, 1 - x, x))


@pytest.mark.parametrize("name, axis, m", [("shear_x", -1, 0.9), ("shear_y", -2, 0.9), ("translate_x", -1, 0.3),
                                           ("translate_y", -2, 0.3)])  # the middle stays inside the image
def test_geometric_ops_move_pixels_along_their_axis_only(name, axis, m):
    """An image constant along the op's axis (rows for _x ops) keeps its middle exactly: pixels slide along the
    axis, so each reads a value from its own row (column); the same op across the other axis changes it."""
    ramp = torch.linspace(0.1, 0.9, 16)
    along = ramp.view(16, 1).expand(16, 16) if axis == -1 else ramp.view(1, 16).expand(16, 16)  # constant on axis
    across = along.T
    middle = (slice(None), slice(None), slice(6, 10), slice(6, 10))
    moved = _geometric_op(name, along.reshape(1, 1, 16, 16).clone(), m, torch.Generator().manual_seed(0))
    assert torch.allclose(moved[middle], along.reshape(1, 1, 16, 16)[middle], atol=1e-5), name
    moved = _geometric_op(name, across.reshape(1, 1, 16, 16).clone(), m, torch.Generator().manual_seed(0))
    assert (moved[middle] - across.reshape(1, 1, 16, 16)[middle]).abs().max() > 0.01, name


def test_auto_contrast_stretches_each_channel_of_each_image_and_keeps_a_flat_one():
    x = images(4).float() / 255 * torch.tensor([0.5, 0.3, 0.8]).view(3, 1, 1) + 0.1  # each channel a range of its own
    x[1] = 0.4  # a constant image
    x[2, 1] = 0.9  # a constant channel
    expected = x.clone()
    for i, c in itertools.product(range(4), range(3)):
        low, high = x[i, c].min(), x[i, c].max()
        if high > low:
            expected[i, c] = (x[i, c] - low) / (high - low)
    for m in (0.0, 0.9):  # the op has no strength
        torch.testing.assert_close(_colour_op("auto_contrast", x, m, torch.Generator().manual_seed(0)), expected)


def test_geometric_ops_fill_with_grey_and_move_pixels():
    x = torch.zeros(1, 1, 8, 8)
    x[..., 3, 3] = 1.0
    moved = _geometric_op("translate_x", x, 0.5, torch.Generator().manual_seed(0))  # 0.45 * 0.5 * 8 = 1.8 px
    assert moved[..., 3, :].argmax() in (1, 5)
    assert moved[..., 0, 4] == pytest.approx(0.0) and moved[..., 7, 4] == pytest.approx(0.0)  # black stays black
    edge = _geometric_op("translate_y", torch.ones(1, 1, 8, 8), 1.0, torch.Generator().manual_seed(0))
    assert ((edge - 0.5).abs() < 1e-6).any()  # pixels from outside the image are grey


def test_rand_augment_rejects_bad_input():
    with pytest.raises(ValueError, match="uint8"):
        rand_augment(images().float())
    with pytest.raises(ValueError, match="magnitude must be in 0..10, got 11"):
        rand_augment(images(), magnitude=11)
    with pytest.raises(ValueError, match="got 2 and 1.5"):
        rand_augment(images(), prob=1.5)


def constant_images(b=8, side=16):
    """Image i filled with the value i: every pixel says which image it came from."""
    return torch.arange(b, dtype=torch.float32).view(b, 1, 1, 1).expand(b, 3, side, side).clone()


@pytest.mark.parametrize("seed", range(12))
def test_cutmix_labels_weigh_each_image_by_its_pixels(seed):
    x, y = constant_images(), torch.arange(8) % 10
    mixed, targets = mix_batch(x, y, torch.Generator().manual_seed(seed), num_classes=10, cutmix=1.0, mixup=0.0)
    own = (mixed == x).float().mean(dim=(1, 2, 3))  # (b,) share of each image's own pixels
    assert torch.allclose(targets.sum(1), torch.ones(8))
    for i in range(8):
        assert targets[i, y[i]] == pytest.approx(own[i].item(), abs=1e-6)
        assert targets[i, y[7 - i]] == pytest.approx(1 - own[i].item(), abs=1e-6)


def test_mixup_blends_images_and_labels_in_one_proportion():
    x, y = constant_images(), torch.arange(8)
    mixed, targets = mix_batch(x, y, torch.Generator().manual_seed(3), num_classes=10, cutmix=0.0, mixup=0.8)
    lam = targets[0, 0].item()
    assert 0 < lam < 1
    assert torch.allclose(mixed, lam * x + (1 - lam) * x.flip(0))
    assert torch.allclose(targets[:, :8], lam * torch.eye(8) + (1 - lam) * torch.eye(8).flip(0))


def test_mix_batch_switches_between_cutmix_and_mixup():
    x, y = constant_images(), torch.arange(8)
    kinds = set()
    for seed in range(20):
        mixed, _ = mix_batch(x, y, torch.Generator().manual_seed(seed), num_classes=10, cutmix=1.0, mixup=0.8)
        kinds.add("cutmix" if torch.isin(mixed, x).all() else "mixup")  # CutMix only moves whole pixels
    assert kinds == {"cutmix", "mixup"}


def test_cutmix_box_is_clipped_inside_the_image():
    areas = set()
    for seed in range(50):
        top, bottom, left, right = cutmix_box(32, 32, 0.3, torch.Generator().manual_seed(seed))
        assert 0 <= top <= bottom <= 32 and 0 <= left <= right <= 32
        areas.add(int((bottom - top) * (right - left)))
    assert max(areas) <= round(32 * 0.7**0.5) ** 2 and min(areas) < max(areas)  # 27 x 27 where it fits, else clipped


def test_a_strongly_augmented_batch_reads_nothing_back_from_the_device():
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostReads(TorchDispatchMode):
        reads = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("_local_scalar_dense", "nonzero", "masked_select", "unique"):
                self.reads.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    import functools

    from vit_course.batches import cifar_augment

    augment = functools.partial(cifar_augment, padding=4, rand_ops=2, magnitude=9)
    mix = functools.partial(mix_batch, num_classes=10, cutmix=1.0, mixup=0.8)
    loader = DeviceLoader(images(32, side=16), torch.arange(32) % 10, 16, shuffle=True, mean=0.5, std=0.25,
                          augment=augment, mix=mix)
    with HostReads() as mode:
        for _ in range(3):
            list(loader)
    assert mode.reads == [], f"a batch waited for the device {len(mode.reads)} times: {sorted(set(mode.reads))}"


def test_mix_batch_rejects_bad_input():
    with pytest.raises(ValueError, match="got 0.0 and 0.0"):
        mix_batch(constant_images(), torch.arange(8), num_classes=10, cutmix=0.0, mixup=0.0)
    with pytest.raises(ValueError, match=r"\(8, 3, 16, 16\) and \(7,\)"):
        mix_batch(constant_images(), torch.arange(7), num_classes=10)


def test_a_loader_with_mix_serves_soft_targets_that_train_step_takes():
    import functools

    from vit_course import ViT

    x, y = images(32, side=8), torch.arange(32) % 10
    mix = functools.partial(mix_batch, num_classes=10, cutmix=1.0, mixup=0.8)
    loader = DeviceLoader(x, y, 16, shuffle=True, mean=0.5, std=0.25, mix=mix, seed=0)
    batches = list(loader)
    assert batches[0][1].shape == (16, 10) and torch.allclose(batches[0][1].sum(1), torch.ones(16))
    loader.set_epoch(0)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, loader, strict=True))  # seeded: the same epoch again
    model = ViT(image_size=8, patch_size=4, num_classes=10, dim=16, depth=1, num_heads=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert train_step(model, *batches[0], optimizer, label_smoothing=0.1) > 0
