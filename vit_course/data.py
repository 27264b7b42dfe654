"""MNIST and CIFAR-10 from disk or their official sources (chapters 06-07), as uint8 tensors.

Files sit under a root (``data_root``) in the layouts the official releases unpack to::

    ROOT/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    ROOT/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin     (the binary version: no pickle is loaded)

Missing files are downloaded (``vit_course.download``, which also names the official files). Local files are
checked by their structure (headers, sizes, counts), not by checksum, so re-compressed copies load too. Batches,
normalisation and augmentation: ``vit_course.batches``.
"""

import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from .download import CIFAR_DIR, CIFAR_FILES, MNIST_FILES, DatasetCorrupt, DatasetNotFound, fetch

CIFAR_RECORDS = 10_000  # images in each CIFAR-10 batch file


# mean and std: per channel in 0..1 pixel units, computed once from the train split of the copies in
# .data (MNIST: identical to the official files; CIFAR-10: the JPEG-decoded copy, whose means match the
# official set and whose stds sit 0.001-0.002 below the official 0.2470, 0.2435, 0.2616).
DATASETS = {
    "mnist": {
        "classes": [str(d) for d in range(10)],
        "shape": (1, 28, 28),
        "sizes": {"train": 60_000, "test": 10_000},
        "validation": 5_000,  # training images held out for validation (``split_validation``)
        "mean": (0.1307,),
        "std": (0.3081,),
    },
    "cifar10": {
        "classes": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
        "shape": (3, 32, 32),
        "sizes": {"train": 50_000, "test": 10_000},
        "validation": 5_000,
        "mean": (0.4913, 0.4821, 0.4465),
        "std": (0.2452, 0.2428, 0.2606),
    },
}
SPLITS = ("train", "test")


def data_root(root=None):
    """The folder holding the datasets: ``root``, else ``$VIT_COURSE_DATA``, else a per-user cache folder."""
    if root is not None:
        return Path(root).expanduser()
    if os.environ.get("VIT_COURSE_DATA"):
        return Path(os.environ["VIT_COURSE_DATA"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "vit_course"


def _expected_files(name, split):
    """Paths relative to the root that one split needs."""
    if name == "mnist":
        return [f"mnist/{f}" for f in MNIST_FILES[split]]
    return [f"{CIFAR_DIR}/{f}" for f in CIFAR_FILES[split]]


def _check(name, split):
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: choose one of {sorted(DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: choose one of {list(SPLITS)}")


def load(name, split="train", root=None, download=True):
    """One split of a dataset as uint8 images (N, C, H, W) and int64 labels (N,), downloading what is missing.

    name: "mnist" -> (N, 1, 28, 28), or "cifar10" -> (N, 3, 32, 32); split: "train" or "test".
    Raises DatasetNotFound when the files are missing and cannot be downloaded, DatasetCorrupt when a file
    is damaged (the message names it and what is wrong).
    """
    _check(name, split)
    root = data_root(root)
    missing = [f for f in _expected_files(name, split) if not (root / f).is_file()]
    if missing:
        fetch(name, split, root, missing, download)
    count = DATASETS[name]["sizes"][split]
    files = [root / f for f in _expected_files(name, split)]
    if name == "mnist":
        return read_mnist(*files, count=count)
    parts = [read_cifar(f, CIFAR_RECORDS) for f in files]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])  # (N, 3, 32, 32), (N,)


EXAMPLES = Path(__file__).with_name("cifar10_examples.npz")  # shipped with the package, 1.5 MB


def load_examples():
    """The course's example images: the first 512 test images of its copy of CIFAR-10, shipped with the package.

    Chapters 08 and 09 look at these, so every learner sees the same pictures and numbers: the official files,
    which a learner with internet downloads, hold the test images in another order (and the course's copy is a
    JPEG-decoded one). -> images uint8 (512, 3, 32, 32), labels int64 (512,).
    """
    with np.load(EXAMPLES) as stored:
        return torch.from_numpy(stored["images"]), torch.from_numpy(stored["labels"]).long()


def split_validation(images, labels, size):
    """Hold ``size`` images of a training split out for validation: -> (train images, train labels), (validation
    images, validation labels).

    The held-out images are a random draw from a generator seeded 0, not from the run's seed: every run, recipe and
    chapter validates on the same images and never trains on them. Their order, and the rest's, stays the file's.
    """
    if not 0 <= size < len(labels):
        raise ValueError(f"a validation split of {size} images from a training split of {len(labels)}: give 0 to "
                         f"{len(labels) - 1}")
    held_out = torch.zeros(len(labels), dtype=torch.bool)
    held_out[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))[:size]] = True
    return (images[~held_out], labels[~held_out]), (images[held_out], labels[held_out])


def read_mnist(images_file, labels_file, count=None):
    """Two gzipped IDX files -> images uint8 (N, 1, 28, 28), labels int64 (N,).

    Checks that the images are 28x28, that there are as many labels as images, and ``count`` of each if given.
    """
    images, labels = read_idx(images_file), read_idx(labels_file)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DatasetCorrupt(f"{images_file}: expected images of shape (N, 28, 28), found {tuple(images.shape)}")
    if labels.ndim != 1:
        raise DatasetCorrupt(f"{labels_file}: expected a labels file, found shape {tuple(labels.shape)}")
    if len(labels) != len(images):
        raise DatasetCorrupt(f"{labels_file} has {len(labels):,} labels but {images_file} has {len(images):,} images")
    if count is not None and len(images) != count:
        raise DatasetCorrupt(f"{images_file}: expected {count:,} images, found {len(images):,}")
    if len(labels) and labels.max() > 9:
        raise DatasetCorrupt(f"{labels_file}: labels must be 0..9, found {int(labels.max())}")
    return images[:, None], labels.long()  # (N, 1, 28, 28) uint8, (N,) int64


def read_idx(path):
    """A gzipped IDX file of unsigned bytes -> uint8 tensor of the shape its header gives.

    Checks the magic number (2051 images with 3 dims, 2049 labels with 1 dim) and that the decompressed size
    is exactly header + product of dims.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:  # not gzip, truncated stream, bad CRC
        raise DatasetCorrupt(f"{path}: cannot be decompressed ({error})") from error
    magic = int.from_bytes(data[:4], "big")
    ndim = {2051: 3, 2049: 1}.get(magic)
    if ndim is None:
        raise DatasetCorrupt(f"{path}: IDX magic number {magic}, expected 2051 (images) or 2049 (labels)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetCorrupt(f"{path}: expected a {header}-byte IDX header, found {len(data)} bytes")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(data) != expected:
        raise DatasetCorrupt(f"{path}: expected {expected:,} bytes (a {header}-byte header and dims {dims}) "
                             f"after decompression, found {len(data):,}")
    return torch.from_numpy(np.frombuffer(data, np.uint8, offset=header).reshape(dims).copy())


def read_cifar(path, records=CIFAR_RECORDS):
    """A CIFAR-10 binary batch -> images uint8 (records, 3, 32, 32), labels int64 (records,).

    Each record is one label byte then 3,072 pixel bytes: the red, green, blue 32x32 planes, row by row.
    """
    path = Path(path)
    size, record = path.stat().st_size, 1 + 3 * 32 * 32
    if size != records * record:
        hint = "" if size % record == 0 else f", not a multiple of {record:,}: truncated or not a CIFAR-10 batch"
        raise DatasetCorrupt(f"{path}: expected {records * record:,} bytes ({records:,} records of {record:,}), "
                             f"found {size:,}{hint}")
    data = np.fromfile(path, np.uint8).reshape(records, record)  # (records, 3073)
    labels = data[:, 0].astype(np.int64)  # (records,)
    if labels.max(initial=0) > 9:
        raise DatasetCorrupt(f"{path}: labels must be 0..9, found {int(labels.max())}")
    images = data[:, 1:].reshape(records, 3, 32, 32)  # (records, 3, 32, 32): planes are already channel-first
    return torch.from_numpy(images.copy()), torch.from_numpy(labels)


__all__ = ["DATASETS", "DatasetCorrupt", "DatasetNotFound", "data_root", "load", "load_examples", "read_cifar",
           "split_validation",
           "read_idx", "read_mnist"]
