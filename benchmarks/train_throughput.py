"""How much of this CPU's matmul throughput the training step reaches, and whether bf16 autocast helps.

Measures (1) GFLOP/s of a big square matmul (fp32, and bf16 at a smaller size), (2) for each recipe's
model, the FLOPs of one training step (forward + backward, counted by torch's FlopCounterMode: matmuls,
convolutions, attention) and its wall time, so achieved GFLOP/s and their share of (1); optionally (3) the
step under bf16 autocast, alternated with the float32 step (``--record`` keeps that comparison in
benchmarks/results/bf16_speedup.json). Prints the 1-minute load average before and after: on a shared
machine every number scales with it.

    python benchmarks/train_throughput.py [--threads N] [--steps 5] [--size 2048] [--bf16 [--record]]
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vit_course import ViT  # noqa: E402
from vit_course.device import machine  # noqa: E402
from vit_course.files import write_json  # noqa: E402
from vit_course.recipes import RECIPES  # noqa: E402
from vit_course.train import param_groups  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_gflops(size, dtype, repeats=5):
    """Median GFLOP/s of (size x size) @ (size x size) in ``dtype``."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * size**3 / statistics.median(times) / 1e9


def training_step(name, autocast=False):
    """A closure running one training step of recipe ``name``'s model on a fixed random batch (its batch size)."""
    recipe = RECIPES[name]
    torch.manual_seed(0)
    model = ViT(**recipe["model"]).train()
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
    batch = recipe["train"]["batch_size"]
    c, h = recipe["model"]["in_channels"], recipe["model"]["image_size"]
    x, y = torch.randn(batch, c, h, h), torch.randint(0, 10, (batch,))  # (b, C, H, W), (b,)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)

    def step():
        with context:
            logits = model(x)
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


def step_flops_and_seconds(name, steps, autocast=False):
    """(FLOPs of one training step, median seconds per step) for recipe ``name``'s model at its batch size."""
    step = training_step(name, autocast)
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops(), statistics.median(seconds_of(step) for _ in range(steps))


def bf16_speedup(name, rounds):
    """float32 and bf16-autocast steps of recipe ``name``, alternated in one process (a float32 step, then a bf16
    one, ``rounds`` times, after one warm-up each), so that a change in the machine's speed hits both alike.
    -> dict of the median seconds of each and the median of the per-round ratios (float32 / bf16)."""
    fp32, bf16 = training_step(name), training_step(name, autocast=True)
    fp32(), bf16()  # warm-up: first calls allocate and pick kernels
    pairs = [(seconds_of(fp32), seconds_of(bf16)) for _ in range(rounds)]
    return {"recipe": name, "rounds": rounds, "fp32_ms": round(1000 * statistics.median(a for a, _ in pairs), 1),
            "bf16_ms": round(1000 * statistics.median(b for _, b in pairs), 1),
            "speedup": round(statistics.median(a / b for a, b in pairs), 3),
            "speedup_range": [round(min(a / b for a, b in pairs), 3), round(max(a / b for a, b in pairs), 3)]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--bf16", action="store_true", help="also time bf16 matmul and the bf16 autocast step")
    parser.add_argument("--record", action="store_true",
                        help="with --bf16: append the step comparison to benchmarks/results/bf16_speedup.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load, bf16 = os.getloadavg()[0], []
    print(f"torch {torch.__version__}, {args.threads} threads, load before {load:.1f}")
    peak = matmul_gflops(args.size, torch.float32)
    print(f"matmul fp32 {args.size}^2: {peak:.1f} GFLOP/s")
    if args.bf16:
        print(f"matmul bf16 512^2: {matmul_gflops(512, torch.bfloat16, repeats=3):.1f} GFLOP/s "
              f"(fp32 512^2: {matmul_gflops(512, torch.float32):.1f})")
    for name in ("mnist", "cifar10"):
        # the matmul again right before and after the steps: on a shared machine the share is only
        # meaningful against the throughput available at the same moment
        before = matmul_gflops(args.size, torch.float32, repeats=3)
        flops, seconds = step_flops_and_seconds(name, args.steps)
        now = (before + matmul_gflops(args.size, torch.float32, repeats=3)) / 2
        achieved = flops / seconds / 1e9
        print(f"{name}: {flops / 1e9:.2f} GFLOP per step, {seconds * 1000:.0f} ms -> {achieved:.1f} GFLOP/s "
              f"= {achieved / now:.0%} of the matmul's {now:.1f} GFLOP/s measured around it")
        if args.bf16:
            bf16.append(bf16_speedup(name, args.steps))
            print(f"{name}, float32 and bf16 autocast steps alternated: {bf16[-1]['fp32_ms']:.0f} vs "
                  f"{bf16[-1]['bf16_ms']:.0f} ms, bf16 {bf16[-1]['speedup']:.2f}x as fast (rounds "
                  f"{bf16[-1]['speedup_range'][0]:.2f}-{bf16[-1]['speedup_range'][1]:.2f}x)")
    print(f"load after {os.getloadavg()[0]:.1f}")
    if args.record and bf16:
        path = RESULTS / "bf16_speedup.json"
        runs = json.loads(path.read_text())["runs"] if path.is_file() else []
        write_json(path, {"command": "python benchmarks/train_throughput.py --bf16 --record", "runs": runs + [
            {"steps": bf16, "threads": args.threads, "load_before": load, "load_after": os.getloadavg()[0],
             "machine": machine()}]})


if __name__ == "__main__":
    main()
