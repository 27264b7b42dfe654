"""How much of this CPU's matmul throughput the training step reaches, and whether bf16 autocast helps.

Measures (1) GFLOP/s of a big square matmul (fp32, and bf16 at a smaller size), (2) for each recipe's
model, the FLOPs of one training step (forward + backward, counted by torch's FlopCounterMode: matmuls,
convolutions, attention) and its wall time, so achieved GFLOP/s and their share of (1); optionally (3) the
step under bf16 autocast and (4) the step of the model compiled by ``torch.compile``, each alternated with the
plain float32 step (``--record`` keeps these comparisons in benchmarks/results/train_throughput_bf16.json and
train_throughput_compile.json). Prints the 1-minute load average before and after: on a shared
machine every number scales with it.

    python benchmarks/train_throughput.py [--threads N] [--steps 5] [--size 2048] [--bf16] [--compile] [--record]
"""

import argparse
import json
import os
import statistics
import time

import torch
from common import RESULTS, alternated, seconds_of, training_step
from machine import machine
from torch.utils.flop_counter import FlopCounterMode

from vit_course.files import write_json
from vit_course.recipes import RECIPES


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


def step_flops_and_seconds(name, steps, autocast=False):
    """(FLOPs of one training step, median seconds per step) for recipe ``name``'s model at its batch size."""
    step = training_step(name, autocast)
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops(), statistics.median(seconds_of(step) for _ in range(steps))


def bf16_speedup(name, rounds):
    """float32 and bf16-autocast steps of recipe ``name``, alternated: -> dict (see ``alternated``)."""
    steps = {"fp32": training_step(name), "bf16": training_step(name, autocast=True)}
    return {"recipe": name, "rounds": rounds, **alternated(steps, rounds)}


def compile_speedup(name, rounds):
    """Eager and ``torch.compile``d float32 steps of recipe ``name``, alternated: -> dict (see ``alternated``),
    with the seconds of the first compiled step, compilation included (a time-budgeted run would pay them)."""
    eager, compiled = training_step(name), training_step(name, compiled=True)
    compile_seconds = seconds_of(compiled)
    return {"recipe": name, "rounds": rounds, "compile_seconds": round(compile_seconds, 1),
            **alternated({"eager": eager, "compiled": compiled}, rounds)}


COMPARISONS = {  # flag: (function, what its ratio means, the file --record appends to)
    "bf16": (bf16_speedup, "float32 and bf16 autocast steps", "train_throughput_bf16.json"),
    "compile": (compile_speedup, "eager and torch.compile'd float32 steps", "train_throughput_compile.json"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--bf16", action="store_true", help="also time bf16 matmul and the bf16 autocast step")
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile'd step")
    parser.add_argument("--record", action="store_true", help="append the step comparisons asked for to "
                        "benchmarks/results/train_throughput_bf16.json and train_throughput_compile.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load, compared = os.getloadavg()[0], {flag: [] for flag in COMPARISONS if getattr(args, flag)}
    print(f"torch {torch.__version__}, {args.threads} threads, load before {load:.1f}")
    peak = matmul_gflops(args.size, torch.float32)
    print(f"matmul fp32 {args.size}^2: {peak:.1f} GFLOP/s")
    matmul = {f"fp32_{args.size}": round(peak, 1)}  # GFLOP/s, recorded with the comparisons
    if args.bf16:
        matmul.update(bf16_512=round(matmul_gflops(512, torch.bfloat16, repeats=3), 1),
                      fp32_512=round(matmul_gflops(512, torch.float32), 1))
        print(f"matmul bf16 512^2: {matmul['bf16_512']:.1f} GFLOP/s (fp32 512^2: {matmul['fp32_512']:.1f})")
    for name in ("mnist", "cifar10"):
        # the matmul again right before and after the steps: on a shared machine the share is only
        # meaningful against the throughput available at the same moment
        before = matmul_gflops(args.size, torch.float32, repeats=3)
        flops, seconds = step_flops_and_seconds(name, args.steps)
        now = (before + matmul_gflops(args.size, torch.float32, repeats=3)) / 2
        achieved = flops / seconds / 1e9
        print(f"{name}: {flops / 1e9:.2f} GFLOP per step, {seconds * 1000:.0f} ms -> {achieved:.1f} GFLOP/s "
              f"= {achieved / now:.0%} of the matmul's {now:.1f} GFLOP/s measured around it")
        for flag, results in compared.items():
            function, what, _ = COMPARISONS[flag]
            results.append(result := {**function(name, args.steps), "model": RECIPES[name]["model"],  # what ran
                                      "batch_size": RECIPES[name]["train"]["batch_size"]})
            first, second = (f"{v:.0f} ms" for k, v in result.items() if k.endswith("_ms"))
            print(f"{name}, {what} alternated: {first} vs {second}, the second {result['speedup']:.2f}x as fast "
                  f"(rounds {result['speedup_range'][0]:.2f}-{result['speedup_range'][1]:.2f}x)"
                  + (f"; compiling took {result['compile_seconds']:.0f} s" if "compile_seconds" in result else ""))
    print(f"load after {os.getloadavg()[0]:.1f}")
    for flag, results in compared.items() if args.record else ():
        path = RESULTS / COMPARISONS[flag][2]
        runs = json.loads(path.read_text())["runs"] if path.is_file() else []
        write_json(path, {"command": f"python benchmarks/train_throughput.py --{flag} --record", "runs": runs + [
            {"steps": results, "matmul_gflops": matmul, "threads": args.threads, "load_before": load,
             "load_after": os.getloadavg()[0], "machine": machine()}]})


if __name__ == "__main__":
    main()
