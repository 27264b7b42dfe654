"""What a measurement ran on and how busy the machine was, for the records beside it (the lab's, not the course's).

``machine()`` describes the CPU (model, vector instructions, native bfloat16, AMX, cores); ``load_average()`` is the
1-minute load average. Every script that records a run writes them with it: a budget-filled run measures the
machine as much as the recipe. ``python -m vit_course train`` records neither; ``targets.py`` and ``ablate.py``,
which run it, add them (``recorded``).
"""

import os

import common  # noqa: F401 (this checkout's vit_course first on the path)
import torch

from vit_course.device import BF16_FLAGS
from vit_course.files import write_json


def cpu_info():
    """(CPU model name, set of instruction-set flags) from /proc/cpuinfo; (None, None) where it is missing."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return name, set(flags)


def _any_of(flags, wanted):
    """Whether ``flags`` (a set, or None where they could not be read) holds any of ``wanted``; None if unknown."""
    return None if flags is None else bool(wanted & flags)


def machine():
    """What a measurement ran on: CPU model, vector instructions, bf16, AMX, cores.

    ``amx``: Intel's matrix tiles (Sapphire Rapids and later), where bfloat16 products are far faster than on
    AVX-512 BF16 alone; None where /proc/cpuinfo is missing.
    """
    name, flags = cpu_info()  # read once, for both flags
    return {"cpu": name, "vector_isa": torch.backends.cpu.get_cpu_capability(),
            "bf16": _any_of(flags, BF16_FLAGS), "amx": _any_of(flags, {"amx_bf16"}),
            "cores": os.cpu_count()}


def load_average():
    """The 1-minute load average, rounded to 0.01; None where the system has none (Windows)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def recorded(run, metrics_path=None):
    """Run ``run()`` (a training: -> its metrics dict) and return its metrics with the machine and the load average
    before and after (``cpu_load_before``, ``cpu_load_after``, ``machine``: the keys the shipped runs' metrics.json
    hold). ``metrics_path``: the run's metrics.json, rewritten with them, so that a run trained here and shipped
    keeps where it ran."""
    before = load_average()
    metrics = run()
    metrics = {**metrics, "cpu_load_before": before, "cpu_load_after": load_average(), "machine": machine()}
    if metrics_path is not None:
        write_json(metrics_path, metrics)
    return metrics
