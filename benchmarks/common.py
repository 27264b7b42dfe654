"""What the benchmark scripts share: this checkout's ``vit_course`` first on the path, where results go, and timing.

Every script starts with ``import common``. Run as ``python benchmarks/NAME.py``, Python puts this folder on the
path; this module puts the checkout above everything else, so a script measures the course beside it and not an
installed copy of ``vit_course``, which may be another version.
"""

# ruff: noqa: E402 (the checkout goes on the path before vit_course is imported)
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

import torch
import torch.nn.functional as F

from vit_course import ViT
from vit_course.interpret import attention_distances, pixels_per_token, uniform_attention_distance
from vit_course.recipes import RECIPES
from vit_course.train import param_groups


def distance_ratios(model, inputs):
    """Every head's mean attention distance on ``inputs`` (normalised images) as a share of uniform attention's over
    the model's grid: (L, h), 1 for a head that looks as far as uniform attention (chapter 08's unit)."""
    uniform = uniform_attention_distance(model.grid_size, pixels_per_token(model))
    return attention_distances(model.eval(), inputs) / uniform  # (L, h)


def training_step(name, autocast=False, compiled=False, changes=None):
    """A closure running one training step of recipe ``name``'s model on a fixed random batch (its batch size).

    autocast: under bfloat16 autocast; compiled: the model through ``torch.compile`` (its first call compiles);
    changes: model settings that replace the recipe's, e.g. ``{"stem_channels": (16, 32, 64)}``."""
    recipe = RECIPES[name]
    torch.manual_seed(0)
    model = ViT(**{**recipe["model"], **(changes or {})}).train()
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
    batch = recipe["train"]["batch_size"]
    c, h = recipe["model"]["in_channels"], recipe["model"]["image_size"]
    x, y = torch.randn(batch, c, h, h), torch.randint(0, 10, (batch,))  # (b, C, H, W), (b,)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    forward = torch.compile(model) if compiled else model

    def step():
        with context:
            logits = forward(x)
        loss = F.cross_entropy(logits.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def seconds_of(step):
    """Wall seconds of one call of ``step``."""
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def alternated(steps, rounds):
    """Time two steps alternated in one process (the first, then the second, ``rounds`` times, after one warm-up
    each), so that a change in the machine's speed hits both alike. steps: {label: step} with two entries.
    -> {label_ms: median milliseconds of each, "speedup": median of the per-round ratios (first / second),
    "speedup_range": [min, max] of those ratios}."""
    (a_label, a), (b_label, b) = steps.items()
    a(), b()  # warm-up: first calls allocate and pick kernels
    pairs = [(seconds_of(a), seconds_of(b)) for _ in range(rounds)]
    ratios = [x / y for x, y in pairs]
    return {f"{a_label}_ms": round(1000 * statistics.median(x for x, _ in pairs), 1),
            f"{b_label}_ms": round(1000 * statistics.median(y for _, y in pairs), 1),
            "speedup": round(statistics.median(ratios), 3),
            "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)]}


def step_times(steps, rounds=10):
    """Median seconds of each step in ``steps`` ({label: step}, any number of them), after a warm-up call each,
    timed in turn ``rounds`` times, so that a change in the machine's speed hits all alike. -> {label: seconds}."""
    for step in steps.values():
        step()  # warm-up: first calls allocate and pick kernels
    seconds = {label: [] for label in steps}
    for _ in range(rounds):
        for label, step in steps.items():
            seconds[label].append(seconds_of(step))
    return {label: statistics.median(s) for label, s in seconds.items()}


def wait_for_quiet(limit=120.0, poll=5.0):
    """Wait, at most ``limit`` seconds, until the 1-minute load average is half a core below the core count.

    ``python -m vit_course train`` takes a single thread when that average has reached the core count
    (``vit_course.device.pick_threads``), and the average trails the machine by about a minute: a run started
    right after the last one would count it. -> the seconds waited."""
    started, cores = time.perf_counter(), os.cpu_count() or 1
    while os.getloadavg()[0] > cores - 0.5 and time.perf_counter() - started < limit:
        time.sleep(poll)
    return round(time.perf_counter() - started, 1)
