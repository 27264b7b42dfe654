"""Downloading MNIST and CIFAR-10 from their official sources (chapters 06-07), checked and extracted safely.

The official files' names and layout live here, and the errors about them. ``data.load`` calls ``fetch`` for
the files it misses. Downloads are checked against the published MD5s in
``MD5`` and written atomically; the CIFAR-10 archive is extracted member by member, refusing any path that
would leave its folder.
"""

import hashlib
import http.client
import tarfile
import urllib.request
import zlib
from pathlib import Path, PurePosixPath

from .files import atomic_write

# The official files, as the releases name and unpack them
CIFAR_ARCHIVE, CIFAR_DIR = "cifar-10-binary.tar.gz", "cifar-10-batches-bin"
CIFAR_FILES = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]}
MNIST_FILES = {split: [f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"]
               for split, prefix in [("train", "train"), ("test", "t10k")]}

# Where the files come from, tried in order (the S3 mirror first: the classic address often refuses
# scripted downloads); tests point these at a loopback server.
MIRRORS = {
    "mnist": ["https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"],
    "cifar10": ["https://www.cs.toronto.edu/~kriz/"],
}
# MD5 of each downloaded file as published (torchvision's dataset sources and the CIFAR page list the same).
MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530",
}


class DatasetNotFound(FileNotFoundError):
    """The files of a dataset are not on disk and could not be downloaded."""


class DatasetCorrupt(ValueError):
    """A file on disk or a download is not what it should be (structure or checksum)."""


DOWNLOAD_MB = {"mnist": 12, "cifar10": 170}  # what the first load() fetches: the four MNIST files, the archive


def fetch(name, split, root, missing, download):
    """Download what ``load`` misses, or raise DatasetNotFound saying how to provide the files."""
    problems = ["download=False"]
    if download:  # the first load of a dataset says what it costs, once: the files stay in root afterwards
        print(f"downloading {name} (about {DOWNLOAD_MB[name]} MB, once) into {root}", flush=True)
    if download and name == "mnist":
        for rel in missing:
            problems = download_file(rel.split("/")[-1], MIRRORS["mnist"], root / "mnist")
            if problems:
                break
    elif download:
        archive = root / CIFAR_ARCHIVE  # only ever given this name once its MD5 matched
        problems = [] if archive.is_file() else download_file(CIFAR_ARCHIVE, MIRRORS["cifar10"], root)
        if not problems:
            extract_cifar(archive, root)
            archive.unlink()  # 170 MB that the extracted batches make redundant
    if problems:
        why = f"the download failed ({'; '.join(problems)})" if download else "downloading is off (download=False)"
        raise DatasetNotFound(
            f"{name} ({split} split) is not in {root}: expected {', '.join(missing)} there, and {why}. To provide "
            f"the files, copy the official ones into {root} in that layout, or set VIT_COURSE_DATA to a folder "
            "that holds them.")


def download_file(filename, mirrors, folder, timeout=60):
    """Fetch ``filename`` from the first mirror that serves it into ``folder``; returns the problems met.

    The bytes go to a temporary file (``atomic_write``) whose MD5 is checked before it gets its name.
    An unreachable mirror, or one serving other bytes, moves on to the next; when none served the right
    bytes and one served wrong ones, DatasetCorrupt names the file, the expected and the actual MD5.
    """
    problems, mismatch = [], None
    for mirror in mirrors:
        url = mirror + filename

        def save(out, url=url):  # stream into the temporary file; a wrong checksum discards it
            md5 = hashlib.md5()
            with urllib.request.urlopen(url, timeout=timeout) as response:
                while chunk := response.read(1 << 20):
                    md5.update(chunk)
                    out.write(chunk)
            if md5.hexdigest() != MD5[filename]:
                raise DatasetCorrupt(f"checksum mismatch for {filename} from {url}: expected MD5 {MD5[filename]}, "
                                     f"got {md5.hexdigest()}; the download was deleted")

        try:
            atomic_write(folder / filename, save)
            return []
        except DatasetCorrupt as error:
            mismatch = error
            problems.append(str(error))
        except (OSError, http.client.HTTPException) as error:  # URLError, HTTPError, timeouts, a full disk; a cut-off
            # transfer (IncompleteRead) is an HTTPException
            problems.append(f"{url}: {getattr(error, 'reason', None) or error}")
    if mismatch is not None:
        raise mismatch
    return problems


def extract_cifar(archive, root):
    """Extract the CIFAR-10 batches from the official tar into ``root/cifar-10-batches-bin``, safely.

    Only regular files named ``cifar-10-batches-bin/<expected name>`` are written (each atomically); a member
    whose path leaves the folder, is absolute, or is a link is refused with DatasetCorrupt; others are skipped.
    """
    wanted = {*CIFAR_FILES["train"], *CIFAR_FILES["test"], "batches.meta.txt"}
    target = Path(root) / CIFAR_DIR
    target.mkdir(parents=True, exist_ok=True)
    written = set()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                path = PurePosixPath(member.name)
                if path.is_absolute() or ".." in path.parts or member.issym() or member.islnk():
                    raise DatasetCorrupt(f"{archive}: refusing member {member.name!r} (absolute, '..' or a link)")
                if not (member.isfile() and len(path.parts) == 2 and path.parts[0] == CIFAR_DIR
                        and path.name in wanted):
                    continue  # the directory entry, readme.html
                atomic_write(target / path.name, lambda out, member=member: out.write(tar.extractfile(member).read()))
                written.add(path.name)
    except (tarfile.TarError, EOFError, zlib.error) as error:
        raise DatasetCorrupt(f"{archive}: not a readable tar.gz ({error})") from error
    if lacking := sorted(wanted - written - {"batches.meta.txt"}):
        raise DatasetCorrupt(f"{archive}: lacks {CIFAR_DIR}/{{{', '.join(lacking)}}}")


__all__ = ["CIFAR_FILES", "MD5", "MIRRORS", "MNIST_FILES", "DatasetCorrupt", "DatasetNotFound", "download_file",
           "extract_cifar", "fetch"]
