"""Issue 3's targets, measured: the whole `python -m vit_course train NAME` command, timed from outside.

MNIST: >= 99.0% test accuracy within 300 s; CIFAR-10: >= 75% within 1800 s. Runs the CLI with seeds
0..runs-1, one after another, and prints accuracy, wall seconds (process start to exit), epochs done,
threads and the 1-minute load average before each run, then the mean and spread. On a shared machine
the load decides how many epochs fit in the budget: report it with the numbers.

    python benchmarks/targets.py mnist --runs 3 [--out runs/bench]
    python benchmarks/targets.py cifar10 --runs 2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGETS = {"mnist": (0.99, 300), "cifar10": (0.75, 1800)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    accuracy_target, seconds_target = TARGETS[args.name]
    rows = []
    for seed in range(args.runs):
        out = Path(args.out) / f"{args.name}-seed{seed}"
        load = os.getloadavg()[0]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "vit_course", "train", args.name, "--seed", str(seed), "--out",
                        str(out), "--no-progress"], check=True)
        wall = time.perf_counter() - started
        metrics = json.loads((out / "metrics.json").read_text())
        rows.append((metrics["test_accuracy"], wall))
        ok = metrics["test_accuracy"] >= accuracy_target and wall <= seconds_target
        print(f"seed {seed}: {metrics['test_accuracy']:.2%} in {wall:.0f} s wall, {metrics['epochs']:.2f} epochs, "
              f"{metrics['threads']} threads, load {load:.1f} -> {'meets' if ok else 'misses'} the target",
              flush=True)
    accuracies, walls = zip(*rows, strict=True)
    spread = max(accuracies) - min(accuracies)
    print(f"{args.name}: accuracy mean {statistics.mean(accuracies):.2%}, spread {spread:.2%} "
          f"(min {min(accuracies):.2%}, max {max(accuracies):.2%}); wall max {max(walls):.0f} s "
          f"(target {accuracy_target:.0%} in {seconds_target} s)")


if __name__ == "__main__":
    main()
