"""Batches on the training device (chapters 06-07): normalisation, augmentation and ``loaders``.

The datasets stay on the device as uint8 (``data.load``); ``DeviceLoader`` serves them as normalised, augmented
batches. Everything works on whole batches on any device (CPU, CUDA, MPS), with no per-sample Python loop, and
every random choice comes from a ``torch.Generator`` so that a seed repeats a run exactly.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange

from .augment import rand_augment
from .data import DATASETS, load, split_validation
from .device import pick_device


def _as_channels(values, channels, name, device):
    """mean or std (a number, a sequence or a tensor of ``channels`` values) -> (1, channels, 1, 1) float32."""
    values = torch.as_tensor(values, dtype=torch.float32).flatten()  # checked where it was given, then moved
    if name == "mean" and (values > 1).any():
        raise ValueError(f"mean {values.tolist()} is in 0..255 units; give it in 0..1, as the pixels are read "
                         f"(e.g. DATASETS['cifar10']['mean'])")
    values = values.to(device)
    if values.numel() == 1:
        values = values.expand(channels)
    if values.numel() != channels:
        raise ValueError(f"{name} has {values.numel()} values {values.tolist()}, the images have {channels} channels")
    return values.view(1, channels, 1, 1)


def normalize(images, mean=None, std=None):
    """Images (b, C, H, W) -> float32 (pixels - mean) / std, per channel: the one normalisation of the course.

    uint8 images are read as pixels / 255, float images as pixels already in 0..1; ``mean`` and ``std`` are
    per-channel values (or one for all) in those 0..1 units, e.g. ``DATASETS["cifar10"]["mean"]``; None: 0
    and 1 (uint8 pixels are only scaled, floats are copied as they are). The input is never changed in place.
    """
    if images.ndim != 4:
        raise ValueError(f"expected images of shape (batch, channels, height, width), got {tuple(images.shape)}")
    if not (images.dtype == torch.uint8 or images.is_floating_point()):
        raise TypeError(f"normalize takes uint8 pixels (0..255) or float images in 0..1, got {images.dtype}")
    brightest = images.max().item() if images.is_floating_point() and images.numel() else 0.0
    if brightest > 2:
        raise ValueError(f"normalize reads float images as 0..1, but these reach {brightest:.1f}: pass the uint8 "
                         f"pixels, or divide by 255")
    scale, shift = _scale_shift(mean, std, images.shape[1], images.dtype, images.device)
    return _apply(images, scale, shift)  # (b, C, H, W)


def _scale_shift(mean, std, channels, dtype, device):
    """normalize's per-channel constants on ``device``: x * scale - shift = (x / peak - mean) / std, where peak is
    255 for uint8 pixels and 1 for floats. -> (scale, shift), each (1, C, 1, 1) float32."""
    peak = 255.0 if dtype == torch.uint8 else 1.0
    std = _as_channels(1.0 if std is None else std, channels, "std", device)  # (1, C, 1, 1)
    mean = _as_channels(0.0 if mean is None else mean, channels, "mean", device)
    return 1 / (peak * std), mean / std


def _apply(images, scale, shift):
    """One multiply and one subtract on a float32 copy of ``images`` (b, C, H, W)."""
    return images.to(torch.float32, copy=True).mul_(scale).sub_(shift)


def _randint(high, size, generator, device):
    """Integers uniform in 0..high-1, drawn on the generator's device (it may differ from the images')."""
    where = generator.device if generator is not None else device
    return torch.randint(high, size, generator=generator, device=where).to(device)


def random_crop_flip(images, padding=4, flip=True, generator=None):
    """Zero-pad by ``padding``, take a random HxW crop per sample, then flip each sample left-right with p = 1/2.

    images: (b, C, H, W), any dtype and device -> (b, C, H, W), same dtype and device.
    Crop offsets are uniform in 0..2*padding on each axis, independently per sample; offset (padding, padding)
    with no flip returns the image unchanged.
    """
    if images.ndim != 4:
        raise ValueError(f"expected images of shape (batch, channels, height, width), got {tuple(images.shape)}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    b, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding))  # (b, C, H+2p, W+2p), zeros around
    dy = _randint(2 * padding + 1, (b,), generator, device)  # (b,) top row of each crop
    dx = _randint(2 * padding + 1, (b,), generator, device)  # (b,) left column of each crop
    rows = dy[:, None] + torch.arange(h, device=device)  # (b, H) rows of the padded image to read
    cols = torch.arange(w, device=device).expand(b, w)  # (b, W)
    if flip:
        flipped = _randint(2, (b,), generator, device).bool()  # (b,) one coin per sample
        # a flipped sample reads its columns right to left: crop and mirror in one index
        cols = torch.where(flipped[:, None], cols.flip(-1), cols)  # (b, W)
    cols = dx[:, None] + cols  # (b, W) columns of the padded image to read
    # one gather on the flattened pixels: output[i, ch, y, x] = padded[i, ch, rows[i, y], cols[i, x]].
    # (Indexing padded[batch, channel, rows, cols] says the same but runs several times slower on a CPU.)
    index = rows[:, :, None] * (w + 2 * padding) + cols[:, None, :]  # (b, H, W) flat positions
    index = rearrange(index, "b h w -> b 1 (h w)").expand(b, c, h * w)  # (b, C, H*W), a view
    out = rearrange(padded, "b c h w -> b c (h w)").gather(2, index)  # (b, C, H*W)
    return rearrange(out, "b c (h w) -> b c h w", h=h)  # (b, C, H, W)


def random_translate(images, max_shift=2, generator=None):
    """Shift each image by whole pixels, uniform in [-max_shift, max_shift] per axis, filling with zeros.

    images: (b, C, H, W) -> (b, C, H, W), same dtype and device. The same as a random crop of the
    zero-padded image without the flip: the MNIST augmentation (a flipped digit is another symbol).
    """
    return random_crop_flip(images, padding=max_shift, flip=False, generator=generator)


def mnist_augment(images, generator=None, max_shift=2):
    """MNIST's training augmentation: shifts of up to ``max_shift`` pixels. (b, 1, 28, 28) -> (b, 1, 28, 28).

    A recipe may choose a smaller shift (``RECIPES["mnist"]["augment"]``).
    """
    return random_translate(images, max_shift=max_shift, generator=generator)


def cifar_augment(images, generator=None, padding=4, rand_ops=0, magnitude=9, rand_prob=0.5):
    """CIFAR-10's training augmentation: crop with ``padding`` (the ResNet paper's 4), then flip.

    (b, 3, 32, 32) -> (b, 3, 32, 32). A recipe may choose a milder padding (``RECIPES["cifar10"]["augment"]``), or
    add ``rand_ops`` RandAugment ops of strength ``magnitude``, each applied with probability ``rand_prob``, after
    the flip (``augment.rand_augment``).
    """
    images = random_crop_flip(images, padding=padding, flip=True, generator=generator)
    return rand_augment(images, generator, rand_ops, magnitude, rand_prob) if rand_ops else images


# Each dataset's standard training augmentation: ``loaders(name, ..., augment=True)`` uses it.
AUGMENT = {"mnist": mnist_augment, "cifar10": cifar_augment}


def _make_generator(device, seed):
    """A generator on ``device`` when the backend has one (so random draws stay there), else on the CPU."""
    try:
        return torch.Generator(device=device).manual_seed(seed)
    except RuntimeError:
        return torch.Generator().manual_seed(seed)


class DeviceLoader:
    """A whole split held as uint8 on the device, served as normalised (and optionally augmented) batches.

    images (N, C, H, W) uint8, labels (N,) int64 -> iterating yields (x (b, C, H, W) float32, y (b,) int64)
    on ``device``. ``augment(uint8 batch, generator) -> uint8 batch`` runs on the device before normalising;
    ``mix(x, y, generator) -> (x, soft targets (b, classes))`` after it (``augment.mix_batch``: CutMix, Mixup).
    ``batch(index, generator)`` is that whole path for one batch, and ``indices()`` an epoch's batches as indices:
    a compiled training step runs the two (``loop.whole_step``).

    Epochs: each ``iter()`` runs epoch ``self.epoch`` and then advances it by one, so a fresh loader with the
    same seed repeats the same sequence of epochs. ``set_epoch(n)`` chooses the next epoch (to resume a run).
    The order of epoch e comes from ``torch.randperm`` with a generator seeded by (seed, e); the augmentation
    of epoch e from another one seeded the same way, so both repeat exactly.
    """

    def __init__(self, images, labels, batch_size, *, shuffle=False, augment=None, mean, std, device=None,
                 drop_last=False, seed=0, mix=None):
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.dtype != torch.uint8:
            raise ValueError(f"images must be a uint8 torch tensor (N, C, H, W), as data.load gives them; got a "
                             f"{type(images).__name__} of {images.dtype} {tuple(images.shape)}")
        if labels.shape != images.shape[:1]:
            raise ValueError(f"{images.shape[0]} images but labels of shape {tuple(labels.shape)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = pick_device(device)
        self.images = images.to(self.device)  # (N, C, H, W) uint8: 4x smaller than float32
        self.labels = labels.to(self.device, torch.int64)  # (N,)
        self.batch_size, self.shuffle, self.augment, self.mix = batch_size, shuffle, augment, mix
        self.drop_last, self.seed, self.epoch = drop_last, seed, 0
        self.mean, self.std = mean, std
        # normalize's constants, made once on the device: a batch then needs no copy from the host
        self.scale, self.shift = _scale_shift(mean, std, images.shape[1], torch.uint8, self.device)

    def __len__(self):
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch):
        """The epoch the next ``iter()`` runs (its order and augmentation); e.g. after loading a checkpoint."""
        self.epoch = epoch

    def _seed(self, epoch, stream):
        # distinct, fixed seeds for each (seed, epoch, stream): no global RNG state is read or changed
        return (self.seed * 1_000_003 + epoch) * 2 + stream

    def indices(self):
        """Epoch ``self.epoch``'s batches as index tensors (b,) into the split, in order; advances the epoch by one."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        n = len(self.labels)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self._seed(epoch, 0)))
            order = order.to(self.device)  # (N,) one permutation per epoch, the same on every device
        else:
            order = torch.arange(n, device=self.device)  # (N,)
        return [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(len(self))]  # each (b,)

    def batch(self, index, generator=None):
        """The images at ``index`` (b,) gathered, augmented, normalised and mixed: -> (x (b, C, H, W) float32,
        y (b,) or (b, classes)). Random choices come from ``generator`` (None: torch's global generator)."""
        x = self.images.index_select(0, index)  # (b, C, H, W) uint8; 10x faster than images[index] on a CPU
        if self.augment is not None:
            x = self.augment(x, generator)  # (b, C, H, W) uint8, on the device
        x, y = _apply(x, self.scale, self.shift), self.labels.index_select(0, index)  # (b, C, H, W), (b,)
        return self.mix(x, y, generator) if self.mix is not None else (x, y)  # y: (b,) or (b, classes)

    def __iter__(self):
        epoch = self.epoch
        random = self.augment is not None or self.mix is not None
        generator = _make_generator(self.device, self._seed(epoch, 1)) if random else None
        for index in self.indices():
            yield self.batch(index, generator)


def loaders(name, batch_size, device=None, augment=True, root=None, seed=0, mix=None, validation=None):
    """(train_loader, val_loader, test_loader) of ``name`` with its mean/std and augmentation, on ``device``.

    ``validation``: training images held out as the validation split (None: the dataset's, ``DATASETS[name]
    ["validation"]``, 5,000; 0: none, and val_loader is None), the same images in every run (``data.split_validation``):
    watch training and make choices on it, and read the test set once, at the end. The train loader shuffles,
    augments and drops the last incomplete batch so every step has the same shape; the others keep the order and
    every sample. ``augment``: True for the dataset's own augmentation (CIFAR-10: crop with padding 4 + flip; MNIST:
    shifts of up to 2 pixels), False for none, or a function ``(uint8 batch, generator) -> uint8 batch``. ``mix``:
    see ``DeviceLoader`` (training only).
    """
    images, labels = load(name, "train", root)  # checks the name first
    meta = DATASETS[name]
    size = meta["validation"] if validation is None else validation
    (train_images, train_labels), (val_images, val_labels) = split_validation(images, labels, size)
    test_images, test_labels = load(name, "test", root)
    common = dict(mean=meta["mean"], std=meta["std"], device=device, seed=seed)
    train = DeviceLoader(train_images, train_labels, batch_size, shuffle=True, drop_last=True,
                         augment=AUGMENT[name] if augment is True else augment or None, mix=mix, **common)
    val = DeviceLoader(val_images, val_labels, batch_size, **common) if size else None
    return train, val, DeviceLoader(test_images, test_labels, batch_size, **common)
