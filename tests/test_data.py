"""Data: parsers and their errors, downloads from a loopback server, augmentation, on-device batches."""

import functools
import gzip
import hashlib
import http.client
import http.server
import io
import socket
import tarfile
import threading
import urllib.request

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vit_course import batches, data, download
from vit_course.data import DatasetCorrupt, DatasetNotFound

from .markers import needs_data

# ---------------------------------------------------------------- small files in the official formats


def idx_bytes(array, magic=None):
    """uint8 array -> IDX bytes (magic 2051 for 3 dims, 2049 for 1 dim)."""
    magic = magic or {3: 2051, 1: 2049}[array.ndim]
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_gz(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload))
    return path


def mnist_pair(folder, n=5, prefix="train", n_labels=None):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, (n_labels or n,), dtype=np.uint8)
    return (write_gz(folder / f"{prefix}-images-idx3-ubyte.gz", idx_bytes(images)),
            write_gz(folder / f"{prefix}-labels-idx1-ubyte.gz", idx_bytes(labels)), images, labels)


def cifar_bytes(n, seed=0):
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
    records[:, 0] = rng.integers(0, 10, n)
    return records.tobytes(), records


def test_data_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_COURSE_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data.data_root() == tmp_path / "env"
    monkeypatch.delenv("VIT_COURSE_DATA")
    assert data.data_root() == tmp_path / "xdg" / "vit_course"


def test_read_mnist_valid(tmp_path):
    images_file, labels_file, images, labels = mnist_pair(tmp_path, n=5)
    x, y = data.read_mnist(images_file, labels_file, count=5)
    assert x.shape == (5, 1, 28, 28) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert torch.equal(x[:, 0], torch.from_numpy(images)) and torch.equal(y, torch.from_numpy(labels).long())


def test_read_idx_errors_name_the_file_and_the_problem(tmp_path):
    good = idx_bytes(np.zeros((3, 28, 28), np.uint8))
    truncated = write_gz(tmp_path / "truncated.gz", good[:1000])
    with pytest.raises(DatasetCorrupt, match=r"truncated\.gz: expected 2,368 bytes .* found 1,000"):
        data.read_idx(truncated)
    too_long = write_gz(tmp_path / "long.gz", good + b"\0")
    with pytest.raises(DatasetCorrupt, match=r"long\.gz: expected 2,368 bytes .* found 2,369"):
        data.read_idx(too_long)
    wrong_magic = write_gz(tmp_path / "magic.gz", idx_bytes(np.zeros((3, 28, 28), np.uint8), magic=2052))
    with pytest.raises(DatasetCorrupt, match=r"magic\.gz: IDX magic number 2052"):
        data.read_idx(wrong_magic)
    not_gzip = tmp_path / "plain.gz"
    not_gzip.write_bytes(good)
    with pytest.raises(DatasetCorrupt, match=r"plain\.gz: cannot be decompressed"):
        data.read_idx(not_gzip)


def test_read_mnist_wrong_counts(tmp_path):
    images_file, labels_file, *_ = mnist_pair(tmp_path, n=5, n_labels=4)
    with pytest.raises(DatasetCorrupt, match="has 4 labels but .*images-idx3-ubyte.gz has 5 images"):
        data.read_mnist(images_file, labels_file)
    images_file, labels_file, *_ = mnist_pair(tmp_path, n=5)
    with pytest.raises(DatasetCorrupt, match="expected 60,000 images, found 5"):
        data.read_mnist(images_file, labels_file, count=60_000)


def test_read_idx_and_read_mnist_refuse_a_short_header_and_wrong_shapes(tmp_path):
    short = write_gz(tmp_path / "short.gz", idx_bytes(np.zeros((3, 28, 28), np.uint8))[:6])
    with pytest.raises(DatasetCorrupt, match=r"short\.gz: expected a 16-byte IDX header, found 6 bytes"):
        data.read_idx(short)
    images_file, labels_file, *_ = mnist_pair(tmp_path, n=5)
    small = write_gz(tmp_path / "small.gz", idx_bytes(np.zeros((5, 27, 27), np.uint8)))
    with pytest.raises(DatasetCorrupt, match=r"small\.gz: expected images of shape \(N, 28, 28\), found \(5, 27"):
        data.read_mnist(small, labels_file)
    with pytest.raises(DatasetCorrupt, match=r"images-idx3-ubyte\.gz: expected a labels file, found shape \(5, 28"):
        data.read_mnist(images_file, images_file)
    twelve = write_gz(tmp_path / "twelve.gz", idx_bytes(np.array([0, 1, 12, 3, 4], np.uint8)))
    with pytest.raises(DatasetCorrupt, match=r"twelve\.gz: labels must be 0..9, found 12"):
        data.read_mnist(images_file, twelve)


def test_read_cifar_valid_and_corrupt(tmp_path):
    payload, records = cifar_bytes(4)
    path = tmp_path / "batch.bin"
    path.write_bytes(payload)
    x, y = data.read_cifar(path, records=4)
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert torch.equal(y, torch.from_numpy(records[:, 0]).long())
    assert torch.equal(x[2, 1, 3], torch.from_numpy(records[2, 1 + 1024 + 3 * 32:1 + 1024 + 4 * 32]))  # green row 3
    path.write_bytes(payload[:1000])
    with pytest.raises(DatasetCorrupt, match=r"batch\.bin: expected 12,292 bytes .* found 1,000, not a multiple"):
        data.read_cifar(path, records=4)
    with pytest.raises(DatasetCorrupt, match="expected 30,730,000 bytes"):
        data.read_cifar(tmp_path / "batch.bin")
    bad = records.copy()
    bad[1, 0] = 10
    path.write_bytes(bad.tobytes())
    with pytest.raises(DatasetCorrupt, match="labels must be 0..9, found 10"):
        data.read_cifar(path, records=4)


def test_load_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="'svhn'.*'cifar10', 'mnist'"):
        data.load("svhn", root=tmp_path)
    with pytest.raises(ValueError, match="'val'.*'train', 'test'"):
        data.load("mnist", "val", root=tmp_path)


def test_load_without_download_says_what_to_do(tmp_path):
    with pytest.raises(DatasetNotFound) as error:
        data.load("cifar10", "test", root=tmp_path, download=False)
    message = str(error.value)
    assert str(tmp_path) in message and "cifar-10-batches-bin/test_batch.bin" in message
    assert "VIT_COURSE_DATA" in message


# ---------------------------------------------------------------- the real data (CI sets VIT_COURSE_DATA)



@needs_data
@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_real_data_loads(name):
    meta = data.DATASETS[name]
    for split in ["test", "train"]:
        x, y = data.load(name, split, download=False)
        assert x.shape == (meta["sizes"][split], *meta["shape"]) and x.dtype == torch.uint8
        assert y.dtype == torch.int64 and y.unique().tolist() == list(range(10)) == list(range(len(meta["classes"])))
    # the mean/std constants describe the train split: exact per-channel moments from a histogram of pixel values
    values = torch.arange(256, dtype=torch.float64) / 255
    for c in range(x.shape[1]):
        counts = torch.bincount(x[:, c].flatten(), minlength=256).double()
        mean = (counts * values).sum() / counts.sum()
        std = ((counts * (values - mean) ** 2).sum() / counts.sum()).sqrt()
        assert abs(mean - meta["mean"][c]) < 1e-4 and abs(std - meta["std"][c]) < 1e-4, (c, mean, std)


@needs_data
def test_the_shipped_examples_are_the_first_test_images_of_the_courses_copy():
    """load_examples() ships the first 512 test images of the course's CIFAR-10 copy (chapters 08-09 show them)."""
    images, labels = data.load_examples()
    assert images.shape == (512, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (512,) and labels.dtype == torch.int64
    test_images, test_labels = data.load("cifar10", "test", download=False)
    if not torch.equal(labels, test_labels[:512]):
        pytest.skip("VIT_COURSE_DATA holds another copy of CIFAR-10 (the official files order the images otherwise)")
    # the course's copy, or a recompressed one (the GPU check's: a mean absolute difference of 2.3 of 255)
    difference = (images.float() - test_images[:512].float()).abs().mean().item()
    assert difference < 4, f"the shipped examples differ from the copy's first 512 test images by {difference:.2f}"


@needs_data
def test_real_loaders():
    train, val, test = batches.loaders("mnist", 1000, device="cpu")
    assert len(train) == 55 and len(val) == 5 and len(test) == 10  # 5,000 training images held out
    again = batches.loaders("mnist", 1000, device="cpu", seed=7)[1]  # the same images whatever the run's seed
    assert torch.equal(again.images, val.images) and torch.equal(again.labels, val.labels)
    x, y = next(iter(train))
    assert x.shape == (1000, 1, 28, 28) and x.dtype == torch.float32 and y.shape == (1000,)
    assert abs(x.mean().item()) < 0.2 and 0.8 < x.std().item() < 1.2  # normalised (shifts add a few zeros)



@needs_data
def test_loaders_augment_choices():
    calls = []

    def hook(batch, generator):  # records its calls, changes nothing
        calls.append(tuple(batch.shape))
        return batch

    hooked, *_ = batches.loaders("cifar10", 500, device="cpu", augment=hook)
    plain, *_ = batches.loaders("cifar10", 500, device="cpu", augment=False)
    standard, *_ = batches.loaders("cifar10", 500, device="cpu")
    x, _ = next(iter(hooked))
    assert calls == [(500, 3, 32, 32)]
    assert torch.equal(x, next(iter(plain))[0])  # same seed, same order: the identity hook is no augmentation
    assert plain.augment is None and standard.augment is batches.cifar_augment

# ---------------------------------------------------------------- downloads from a loopback server


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """An HTTP server on 127.0.0.1 serving tmp_path/served; yields its base URL."""
    for var in ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", served
    httpd.shutdown()
    httpd.server_close()


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"  # nothing listens there any more: connection refused


def serve_mnist(served, monkeypatch, n=6):
    """Small MNIST test files on the server, their MD5s in the table, the split size set to match."""
    *_, images, labels = mnist_pair(served, n=n, prefix="t10k")
    for f in ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]:
        monkeypatch.setitem(download.MD5, f, hashlib.md5((served / f).read_bytes()).hexdigest())
    monkeypatch.setitem(data.DATASETS["mnist"]["sizes"], "test", n)
    return images, labels


def test_download_mnist_uses_the_mirror(server, tmp_path, monkeypatch):
    url, served = server
    images, labels = serve_mnist(served, monkeypatch)
    monkeypatch.setitem(download.MIRRORS, "mnist", [closed_port_url(), url])  # the first source is down
    root = tmp_path / "root"
    x, y = data.load("mnist", "test", root=root)
    assert torch.equal(x[:, 0], torch.from_numpy(images)) and torch.equal(y, torch.from_numpy(labels).long())
    assert sorted(p.name for p in (root / "mnist").iterdir()) == ["t10k-images-idx3-ubyte.gz",
                                                                   "t10k-labels-idx1-ubyte.gz"]


def test_a_transfer_cut_short_moves_on_to_the_next_mirror(server, tmp_path, monkeypatch):
    """A mirror that drops the connection mid-file (http.client.IncompleteRead, not an OSError) is a problem met,
    like an unreachable one: the next mirror serves the file and nothing half-written is left."""
    url, served = server
    images, _ = serve_mnist(served, monkeypatch)
    real = urllib.request.urlopen

    class Cut:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, size=-1):
            raise http.client.IncompleteRead(b"\x1f\x8b", 1000)

    cut = "http://cut.invalid/"
    monkeypatch.setattr(download.urllib.request, "urlopen",
                        lambda u, timeout=None: Cut() if u.startswith(cut) else real(u, timeout=timeout))
    monkeypatch.setitem(download.MIRRORS, "mnist", [cut, url])
    root = tmp_path / "root"
    x, _ = data.load("mnist", "test", root=root)
    assert torch.equal(x[:, 0], torch.from_numpy(images))
    assert not any(p.name.endswith(".partial") for p in root.rglob("*"))


def test_download_checksum_mismatch_leaves_nothing(server, tmp_path, monkeypatch):
    url, served = server
    serve_mnist(served, monkeypatch)
    monkeypatch.setitem(download.MD5, "t10k-images-idx3-ubyte.gz", "0" * 32)
    monkeypatch.setitem(download.MIRRORS, "mnist", [url])
    root = tmp_path / "root"
    actual = hashlib.md5((served / "t10k-images-idx3-ubyte.gz").read_bytes()).hexdigest()
    with pytest.raises(DatasetCorrupt, match=f"t10k-images-idx3-ubyte.gz .*expected MD5 0{{32}}, got {actual}"):
        data.load("mnist", "test", root=root)
    assert list((root / "mnist").iterdir()) == []  # neither the final file nor a .partial


def test_offline_error_is_helpful(tmp_path, monkeypatch):
    monkeypatch.setitem(download.MIRRORS, "mnist", [closed_port_url(), closed_port_url()])
    root = tmp_path / "root"
    with pytest.raises(DatasetNotFound) as error:
        data.load("mnist", "train", root=root)
    message = str(error.value)
    for part in [str(root), "mnist/train-images-idx3-ubyte.gz", "mnist/train-labels-idx1-ubyte.gz",
                 "VIT_COURSE_DATA", "refused"]:
        assert part in message
    assert isinstance(error.value, FileNotFoundError)
    assert not any(p.name.endswith(".partial") for p in root.rglob("*"))


def make_tar(path, members):
    """members: {name: bytes, or ("symlink", target)} -> a tar.gz at path."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(content, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, content[1]
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path


def test_download_cifar(server, tmp_path, monkeypatch, capsys):
    url, served = server
    monkeypatch.setattr(data, "CIFAR_RECORDS", 3)
    monkeypatch.setitem(data.DATASETS["cifar10"]["sizes"], "train", 15)
    batches = {f"cifar-10-batches-bin/{f}": cifar_bytes(3, seed=i)[0]
               for i, f in enumerate(data.CIFAR_FILES["train"] + data.CIFAR_FILES["test"])}
    archive = make_tar(served / "cifar-10-binary.tar.gz", {**batches, "cifar-10-batches-bin/readme.html": b"hi"})
    monkeypatch.setitem(download.MD5, "cifar-10-binary.tar.gz", hashlib.md5(archive.read_bytes()).hexdigest())
    monkeypatch.setitem(download.MIRRORS, "cifar10", [url])
    root = tmp_path / "root"
    x, y = data.load("cifar10", "train", root=root)
    assert f"about {download.DOWNLOAD_MB['cifar10']} MB" in capsys.readouterr().out  # the first load says its size
    assert x.shape == (15, 3, 32, 32) and y.shape == (15,)
    first = np.frombuffer(batches["cifar-10-batches-bin/data_batch_1.bin"], np.uint8).reshape(3, 3073)
    assert torch.equal(x[:3].flatten(1), torch.from_numpy(first[:, 1:].copy()))
    assert sorted(p.name for p in root.rglob("*")) == sorted(["cifar-10-batches-bin", *[n.split("/")[1]
                                                                                       for n in batches]])


@pytest.mark.parametrize("member", ["../escape.bin", "/tmp/absolute.bin", "cifar-10-batches-bin/../../x.bin",
                                    ("link", "cifar-10-batches-bin/data_batch_1.bin")])
def test_extract_refuses_escapes_and_links(tmp_path, member):
    members = {"cifar-10-batches-bin/test_batch.bin": b"x"}
    if isinstance(member, tuple):
        members[member[1]] = ("symlink", "/etc/passwd")
    else:
        members[member] = b"evil"
    archive = make_tar(tmp_path / "a.tar.gz", members)
    root = tmp_path / "deep" / "root"
    with pytest.raises(DatasetCorrupt, match="refusing member"):
        download.extract_cifar(archive, root)
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()}
    assert written <= {"a.tar.gz", "deep/root/cifar-10-batches-bin/test_batch.bin"}


# ---------------------------------------------------------------- augmentation


def find_crop(out, padded, size):
    """The (dy, dx, flipped) whose crop of ``padded`` (C, H+2p, W+2p) equals ``out`` (C, H, W), or None."""
    h, w = size
    for dy in range(padded.shape[1] - h + 1):
        for dx in range(padded.shape[2] - w + 1):
            crop = padded[:, dy:dy + h, dx:dx + w]
            for flipped in (False, True):
                if torch.equal(out, crop.flip(-1) if flipped else crop):
                    return dy, dx, flipped
    return None


def test_random_crop_flip_is_a_crop_of_the_padded_input():
    images = torch.randint(1, 256, (600, 2, 6, 5), dtype=torch.uint8)  # no zeros: each crop is unique
    out = batches.random_crop_flip(images, padding=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    padded = F.pad(images, (2, 2, 2, 2))
    found = [find_crop(o, p, (6, 5)) for o, p in zip(out, padded, strict=True)]
    assert None not in found  # every output is a crop of its own padded input, maybe flipped
    offsets = {(dy, dx) for dy, dx, _ in found}
    assert offsets == {(dy, dx) for dy in range(5) for dx in range(5)}  # every offset occurs
    flips = sum(f for *_, f in found)
    assert 240 < flips < 360  # p = 1/2: 300 +- 5 standard deviations


def test_random_crop_flip_determinism_and_variety():
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    a = batches.random_crop_flip(images, generator=torch.Generator().manual_seed(1))
    b = batches.random_crop_flip(images, generator=torch.Generator().manual_seed(1))
    c = batches.random_crop_flip(images, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(batches.random_crop_flip(images, padding=0, flip=False), images)
    floats = batches.random_crop_flip(images.float(), generator=torch.Generator().manual_seed(1))
    assert floats.dtype == torch.float32 and torch.equal(floats, a.float())
    with pytest.raises(ValueError, match=r"\(3, 32, 32\)"):
        batches.random_crop_flip(images[0])


def test_random_translate():
    images = torch.randint(1, 256, (300, 1, 5, 5), dtype=torch.uint8)
    out = batches.random_translate(images, max_shift=1, generator=torch.Generator().manual_seed(0))
    found = [find_crop(o, p, (5, 5)) for o, p in zip(out, F.pad(images, (1, 1, 1, 1)), strict=True)]
    assert None not in found and not any(f for *_, f in found)  # shifts only, never a mirror
    assert {(dy, dx) for dy, dx, _ in found} == {(dy, dx) for dy in range(3) for dx in range(3)}


def test_normalize():
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 1, 3).expand(2, 3, 1, 3)
    x = batches.normalize(images, mean=(0.0, 0.2, 1.0), std=(1.0, 0.5, 2.0))
    assert x.dtype == torch.float32 and x.shape == (2, 3, 1, 3)
    expected = torch.tensor([[0.0, 0.2, 1.0], [-0.4, 0.0, 1.6], [-0.5, -0.4, 0.0]])
    assert torch.allclose(x[1, :, 0], expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"mean has 2 values \[0.5, 0.5\], the images have 3 channels"):
        batches.normalize(images, mean=(0.5, 0.5), std=(1.0, 1.0, 1.0))


# ---------------------------------------------------------------- DeviceLoader


def epoch_of(loader):
    xs, ys = zip(*loader, strict=True)
    return torch.cat(xs), torch.cat(ys)


def test_device_loader_epochs():
    n = 103
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    labels = torch.arange(n)  # label = index: shows which samples came out
    kw = dict(mean=0.5, std=0.25, shuffle=True, seed=7)
    loader = batches.DeviceLoader(images, labels, 10, **kw)
    assert len(loader) == 11 and loader.device == torch.device("cpu")
    x0, y0 = epoch_of(loader)
    x1, y1 = epoch_of(loader)
    assert sorted(y0.tolist()) == sorted(y1.tolist()) == list(range(n))  # every sample once per epoch
    assert not torch.equal(y0, y1)  # a new order each epoch
    assert x0.dtype == torch.float32 and y0.dtype == torch.int64
    assert torch.allclose(x0, batches.normalize(images[y0], 0.5, 0.25))  # each x goes with its y
    again = batches.DeviceLoader(images, labels, 10, **kw)
    assert torch.equal(epoch_of(again)[1], y0) and torch.equal(epoch_of(again)[1], y1)  # the same seed repeats
    again.set_epoch(1)
    assert torch.equal(epoch_of(again)[1], y1)
    other = batches.DeviceLoader(images, labels, 10, **{**kw, "seed": 8})
    assert not torch.equal(epoch_of(other)[1], y0)
    dropped = batches.DeviceLoader(images, labels, 10, drop_last=True, **kw)
    assert len(dropped) == 10 and len(epoch_of(dropped)[1]) == 100
    plain = batches.DeviceLoader(images, labels, 10, mean=0.5, std=0.25)
    assert torch.equal(epoch_of(plain)[1], labels)  # no shuffle: in order


def test_device_loader_augmentation_is_seeded():
    images = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8)
    labels = torch.zeros(40, dtype=torch.int64)
    make = lambda seed: batches.DeviceLoader(images, labels, 16, augment=batches.cifar_augment, mean=0.5, std=0.25,
                                          seed=seed)
    a, b, c = make(0), make(0), make(1)
    xa0, xb0, xc0 = epoch_of(a)[0], epoch_of(b)[0], epoch_of(c)[0]
    assert torch.equal(xa0, xb0) and not torch.equal(xa0, xc0)
    assert not torch.equal(epoch_of(a)[0], xa0)  # new crops in the next epoch
    assert not torch.equal(xa0, batches.normalize(images, 0.5, 0.25))  # the augmentation ran


def test_device_loader_rejects_bad_arguments():
    images, labels = torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"images must be a uint8 torch tensor \(N, C, H, W\), as data.load gives "
                                         r"them; got a Tensor of torch.float32 \(4, 1, 2, 2\)"):
        batches.DeviceLoader(images.float(), labels, 2, mean=0.5, std=0.25)
    with pytest.raises(ValueError, match=r"images must be a uint8 .*got a Tensor of torch.uint8 \(4, 2, 2\)"):
        batches.DeviceLoader(images[:, 0], labels, 2, mean=0.5, std=0.25)
    with pytest.raises(ValueError, match=r"got a ndarray of uint8 \(4, 1, 2, 2\)"):  # NumPy's, not torch's
        batches.DeviceLoader(images.numpy(), labels, 2, mean=0.5, std=0.25)
    with pytest.raises(ValueError, match=r"4 images but labels of shape \(3,\)"):
        batches.DeviceLoader(images, labels[:3], 2, mean=0.5, std=0.25)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        batches.DeviceLoader(images, labels, 0, mean=0.5, std=0.25)


def test_normalize_refuses_pixels_in_the_wrong_units():
    """uint8 pixels or float images in 0..1, and a mean in 0..1: a float image of 0..255 values, integer pixels
    other than uint8 and a mean in 0..255 units would otherwise be normalised silently into nonsense."""
    pixels = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    mean, std = data.DATASETS["cifar10"]["mean"], data.DATASETS["cifar10"]["std"]
    torch.testing.assert_close(batches.normalize(pixels, mean, std), batches.normalize(pixels.float() / 255, mean, std))
    with pytest.raises(ValueError, match="reach 255.0: pass the uint8 pixels, or divide by 255"):
        batches.normalize(torch.full((1, 3, 2, 2), 255.0), mean, std)
    with pytest.raises(TypeError, match="uint8 pixels .* or float images in 0..1, got torch.int64"):
        batches.normalize(pixels.long(), mean, std)
    with pytest.raises(ValueError, match=r"mean \[125.0, 123.0, 114.0\] is in 0..255 units"):
        batches.normalize(pixels, (125.0, 123.0, 114.0), std)


def test_split_validation_holds_out_the_same_images_every_time():
    from vit_course.data import split_validation

    images = torch.arange(100, dtype=torch.uint8).view(100, 1, 1, 1)  # image i is the number i
    labels = torch.arange(100)
    (train, train_labels), (val, val_labels) = split_validation(images, labels, 20)
    assert len(val) == 20 and len(train) == 80 and torch.equal(val.flatten().long(), val_labels)
    assert not set(val.flatten().tolist()) & set(train.flatten().tolist())  # never trained on
    assert set(val.flatten().tolist()) | set(train.flatten().tolist()) == set(range(100))
    assert (train.flatten().diff() > 0).all()  # the rest keep the file's order
    assert val.flatten().tolist() != list(range(20))  # a random draw, not the first images
    assert torch.equal(split_validation(images, labels, 20)[1][0], val)  # the same draw every call
    assert split_validation(images, labels, 0)[1][0].shape[0] == 0
    with pytest.raises(ValueError, match="validation split of 100 images from a training split of 100"):
        split_validation(images, labels, 100)
