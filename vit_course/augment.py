"""The small-data ViT's augmentations (chapters 07-08): RandAugment-style image ops, Mixup and CutMix.

A plain ViT has no locality built in and overfits 50,000 images; the papers that train it on small datasets
(DeiT, Touvron et al. 2021; Lee et al. 2021; Compact Transformers, Hassani et al. 2021) lean on strong
augmentation instead. Everything here works on whole batches on the batch's device, nothing is read back from it,
and every random choice comes from the ``torch.Generator`` passed in, so a seed repeats a run exactly (None: torch's
global generator, which is what a compiled training step draws from: ``loop.whole_step``).

- ``rand_augment``: each image gets ``num_ops`` ops drawn from ``OPS`` at a fixed ``magnitude`` (0..10),
  uint8 in, uint8 out (Cubuk et al. 2020).
- ``mix_batch``: per batch, CutMix (paste a box of another image, Yun et al. 2019) or Mixup (blend two images,
  Zhang et al. 2018), and the labels mixed in the same proportions: -> soft targets (b, classes).
"""

import torch
import torch.nn.functional as F

GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
COLOUR = ("identity", "auto_contrast", "posterize", "solarize", "colour", "contrast", "brightness", "sharpness")
OPS = COLOUR + GEOMETRIC
# at magnitude 10: degrees, shear, shift (share of the side), blend factor 1 +- 0.9, bits removed, solarize threshold
MAX = dict(rotate=30.0, shear=0.3, translate=0.45, factor=0.9, bits=4, solarize=1.0)


def _uniform(size, generator, device):
    """Uniform 0..1 numbers drawn on the generator's device, moved to ``device``."""
    where = generator.device if generator is not None else device
    return torch.rand(size, generator=generator, device=where).to(device)


def _signed(b, generator, device):
    """(b,) random signs, +1 or -1."""
    return torch.where(_uniform(b, generator, device) < 0.5, -1.0, 1.0)


def _grey(x):
    """Luma of (b, 3, H, W) images in 0..1 -> (b, 1, H, W) (ITU-R 601, as PIL's "L" mode); grey images as they are."""
    if x.shape[1] == 1:
        return x
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])


def _blend(x, other, factor):
    """other + factor * (x - other), per image: factor (b,) 1 keeps x, 0 gives other, > 1 pushes away from it."""
    return other + factor.view(-1, 1, 1, 1) * (x - other)


def _colour_op(name, x, m, generator):
    """One colour op at magnitude m (0..1) on float images (b, C, H, W) in 0..1 -> the same shape."""
    b, device = x.shape[0], x.device
    factor = 1.0 + MAX["factor"] * m * _signed(b, generator, device)  # (b,) 1 - 0.9m or 1 + 0.9m
    if name == "identity":
        return x
    if name == "auto_contrast":  # stretch each channel of each image to the full range
        low, high = x.amin(dim=(2, 3), keepdim=True), x.amax(dim=(2, 3), keepdim=True)  # (b, C, 1, 1)
        return torch.where(high > low, (x - low) / (high - low).clamp_min(1e-6), x)
    if name == "posterize":  # keep the top 8 - bits bits of each 8-bit value
        step = 2 ** round(MAX["bits"] * m)
        return torch.div((x * 255).round(), step, rounding_mode="floor") * step / 255
    if name == "solarize":  # invert the 8-bit values at or above 256 (1 - m): none at m = 0
        return torch.where((x * 255).round() >= 256 * (1.0 - MAX["solarize"] * m), 1.0 - x, x)
    if name == "colour":  # saturation: towards or away from the grey image
        return _blend(x, _grey(x), factor)
    if name == "contrast":  # towards or away from the image's mean grey
        return _blend(x, _grey(x).mean(dim=(1, 2, 3), keepdim=True), factor)
    if name == "brightness":  # towards or away from black
        return _blend(x, torch.zeros_like(x), factor)
    if name == "sharpness":  # towards or away from a smoothed copy (PIL's SMOOTH kernel)
        kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], device=x.device) / 13
        kernel = kernel.expand(x.shape[1], 1, 3, 3)  # (C, 1, 3, 3): each channel on its own
        smooth = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel, groups=x.shape[1])
        return _blend(x, smooth, factor)
    raise ValueError(f"unknown op {name!r}; choose one of {', '.join(OPS)}")


def _affine(name, b, m, generator, device):
    """(b, 2, 3) affine matrices of one geometric op in ``affine_grid``'s units (the image spans -1..1)."""
    theta = torch.eye(2, 3, device=device).repeat(b, 1, 1)  # (b, 2, 3) identity
    sign = _signed(b, generator, device)  # (b,)
    if name == "rotate":
        angle = torch.deg2rad(MAX["rotate"] * m * sign)  # (b,)
        theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle)
        theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle), torch.cos(angle)
    elif name == "shear_x":
        theta[:, 0, 1] = MAX["shear"] * m * sign
    elif name == "shear_y":
        theta[:, 1, 0] = MAX["shear"] * m * sign
    elif name == "translate_x":
        theta[:, 0, 2] = 2 * MAX["translate"] * m * sign  # 2: the image is 2 units wide
    elif name == "translate_y":
        theta[:, 1, 2] = 2 * MAX["translate"] * m * sign
    else:
        raise ValueError(f"unknown op {name!r}; choose one of {', '.join(OPS)}")
    return theta


def _geometric_op(name, x, m, generator):
    """One geometric op on float images (b, C, H, W) in 0..1; pixels from outside the image are mid-grey."""
    return _warp(x, _affine(name, x.shape[0], m, generator, x.device))


def _warp(x, theta):
    """Images (b, C, H, W) in 0..1 resampled through affine matrices theta (b, 2, 3); the outside is mid-grey."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)  # (b, H, W, 2) where each pixel reads
    # sampling x - 0.5 with zero padding and adding 0.5 back fills the outside with 0.5 (grey)
    return F.grid_sample(x - 0.5, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + 0.5


def _apply_ops(x, choice, m, generator):
    """Image i of x (b, C, H, W) in 0..1 gets op OPS[choice[i]] at magnitude m -> (b, C, H, W).

    Every op runs on the whole batch and each image keeps the result of the op it drew (``torch.where``). Picking
    out the images of each op instead (``nonzero``) would make the host wait to learn how many there are, 13 times
    per round; this way nothing is read back, the cost is a few more elementwise passes over a small batch. The
    five geometric ops share one resampling: each image's own matrix, the identity for the others.
    """
    b, device = x.shape[0], x.device
    theta = torch.eye(2, 3, device=device).repeat(b, 1, 1)  # (b, 2, 3)
    for k, name in enumerate(OPS):
        if name in GEOMETRIC:
            theta = torch.where((choice == k).view(b, 1, 1), _affine(name, b, m, generator, device), theta)
    geometric = (choice >= len(COLOUR)).view(b, 1, 1, 1)  # OPS lists the colour ops first
    out = torch.where(geometric, _warp(x, theta).clamp(0, 1), x)
    for k, name in enumerate(COLOUR):
        if name != "identity":
            out = torch.where((choice == k).view(b, 1, 1, 1), _colour_op(name, x, m, generator).clamp(0, 1), out)
    return out


def rand_augment(images, generator=None, num_ops=2, magnitude=9, prob=0.5):
    """RandAugment on a batch: each image draws ``num_ops`` ops uniformly from ``OPS`` and applies each, one after
    another, with probability ``prob`` (timm's RandAugment, which DeiT trains with, uses 0.5).

    images: (b, C, H, W) uint8 -> (b, C, H, W) uint8, same device. magnitude: 0..10, the strength of every op
    (rotations up to 30 degrees at 10, shifts up to 45% of the side, blend factors 1 +- 0.9, ...); ops with a
    direction take a random sign per image. num_ops=0 returns the images unchanged. Nothing is read back from the
    device (``_apply_ops``).
    """
    if images.ndim != 4 or images.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images (batch, channels, height, width), got {images.dtype} "
                         f"{tuple(images.shape)}")
    if not 0 <= magnitude <= 10:
        raise ValueError(f"magnitude must be in 0..10, got {magnitude}")
    if num_ops < 0 or not 0 <= prob <= 1:
        raise ValueError(f"num_ops must be >= 0 and prob in 0..1, got {num_ops} and {prob}")
    x, m, b = images.float() / 255, magnitude / 10, images.shape[0]  # (b, C, H, W) in 0..1
    for _ in range(num_ops):
        choice = (_uniform(b, generator, images.device) * len(OPS)).long().clamp_max(len(OPS) - 1)  # (b,)
        skipped = _uniform(b, generator, images.device) >= prob  # (b,) op not applied
        x = _apply_ops(x, torch.where(skipped, OPS.index("identity"), choice), m, generator)
    return (x * 255).round().to(torch.uint8)


def _beta(alpha, generator, device):
    """One draw of Beta(alpha, alpha) as a 0-dim tensor on ``device``: g1 / (g1 + g2) of two Gamma(alpha) draws
    (``torch._standard_gamma``, the sampler ``torch.distributions.Gamma`` calls, which also takes a generator)."""
    where = generator.device if generator is not None else device
    gammas = torch._standard_gamma(torch.full((2,), float(alpha), device=where), generator=generator).to(device)
    return gammas[0] / gammas.sum().clamp_min(1e-12)


def cutmix_box(height, width, lam, generator=None, device=None):
    """A box covering about 1 - lam of an H x W image, centred uniformly, clipped at the edges.

    lam: a number or 0-dim tensor in 0..1. -> (top, bottom, left, right) as 0-dim int64 tensors on ``device`` (the
    generator's by default): rows top..bottom-1, columns left..right-1 (the box may be empty). Tensors, not ints,
    so that nothing is read back from the device and a compiled step sees the same graph for every box.
    """
    device = device or (generator.device if generator is not None else "cpu")
    keep = torch.as_tensor(1 - lam, dtype=torch.float32, device=device).clamp(0, 1).sqrt()  # side share of the box
    cut_h, cut_w = (height * keep).round().long(), (width * keep).round().long()
    centre = (_uniform(2, generator, device) * torch.tensor([height, width], device=device)).long()  # (2,) cy, cx
    top = (centre[0] - cut_h // 2).clamp_min(0)
    bottom = (centre[0] + cut_h - cut_h // 2).clamp_max(height)
    left = (centre[1] - cut_w // 2).clamp_min(0)
    right = (centre[1] + cut_w - cut_w // 2).clamp_max(width)
    return top, bottom, left, right


def mix_batch(images, labels, generator=None, *, num_classes, cutmix=1.0, mixup=0.0, switch=0.5):
    """CutMix or Mixup of a batch with its own reverse, and the labels mixed to match: -> (images, targets).

    images (b, C, H, W) float, labels (b,) int64 -> images (b, C, H, W), targets (b, num_classes) float32 whose rows
    sum to 1. cutmix, mixup: the Beta(alpha, alpha) parameters of each (0: off); with both on, CutMix is chosen with
    probability ``switch``. Image i is mixed with image b-1-i in the proportion lam : 1 - lam, one lam per batch;
    for CutMix lam is the share of image i's own pixels left after pasting the (clipped) box.

    Every choice (which of the two, lam, the box) is drawn on the device from ``generator`` (None: torch's global
    one) and stays there: both mixes are computed and ``torch.where`` keeps the chosen one, so the host never
    waits to learn a choice and a compiled step has one graph for every batch.
    """
    if images.ndim != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"expected images (b, C, H, W) and labels (b,), got {tuple(images.shape)} and "
                         f"{tuple(labels.shape)}")
    if cutmix < 0 or mixup < 0 or cutmix == mixup == 0:
        raise ValueError(f"cutmix and mixup are Beta parameters >= 0, one of them > 0; got {cutmix} and {mixup}")
    (h, w), device = images.shape[-2:], images.device
    other = images.flip(0)  # (b, C, H, W) image b-1-i beside image i
    # (b, classes); not F.one_hot, which reads the labels' min and max back to check them: two waits a batch on a GPU
    one_hot = torch.zeros(len(labels), num_classes, device=device).scatter_(1, labels[:, None], 1.0)
    mixed = cut = None
    if mixup > 0:
        lam_mix = _beta(mixup, generator, device)  # () share of image i
        mixed = (lam_mix * images + (1 - lam_mix) * other, lam_mix)
    if cutmix > 0:
        top, bottom, left, right = cutmix_box(h, w, _beta(cutmix, generator, device), generator, device)
        rows, cols = torch.arange(h, device=device)[:, None], torch.arange(w, device=device)  # (H, 1), (W,)
        box = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)  # (H, W) pixels pasted from other
        lam_cut = 1 - box.float().mean()  # () the share of image i's own pixels actually left
        cut = (torch.where(box, other, images), lam_cut)
    if mixed is None or cut is None:
        images, lam = mixed or cut
    else:
        use_cutmix = _uniform((), generator, device) < switch  # () bool
        images, lam = torch.where(use_cutmix, cut[0], mixed[0]), torch.where(use_cutmix, cut[1], mixed[1])
    return images, lam * one_hot + (1 - lam) * one_hot.flip(0)


__all__ = ["OPS", "cutmix_box", "mix_batch", "rand_augment"]
