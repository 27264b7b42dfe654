"""Writing files so that a crash never leaves half of one (every chapter that saves something).

Checkpoints, metrics, figures, datasets and generated notebooks all go through ``atomic_write``: the
bytes go to a temporary file beside the target, which is renamed onto it only once it is complete.
"""

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path, write):
    """Call ``write(file_object)`` on a temporary file beside ``path``, then rename it onto ``path``.

    ``write`` gets a binary file. A crash or an exception inside it leaves the old file (or none) in place,
    never half a file. -> ``path`` as a Path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a checkpoint or a figure is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path, text):
    """Write ``text`` as UTF-8, atomically."""
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_json(path, data):
    """Write ``data`` as indented JSON, atomically."""
    return write_text(path, json.dumps(data, indent=2) + "\n")


def append_run(path, run, **header):
    """Append ``run`` to the "runs" list of the JSON file ``path``, atomically; a new file starts as
    ``{**header, "runs": []}`` (e.g. ``recipe="mnist"``). The benchmarks' ``--record`` goes through it."""
    path = Path(path)
    stored = json.loads(path.read_text()) if path.exists() else {**header, "runs": []}
    return write_json(path, {**stored, "runs": stored["runs"] + [run]})
