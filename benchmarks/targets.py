"""The time-to-accuracy targets, measured: the whole `python -m vit_course train NAME` command, timed from outside.

MNIST: >= 99.3% test accuracy within 300 s; CIFAR-10: >= 80% within 1800 s (whole command, start-up and data
loading included). Runs the CLI with seeds 0..runs-1, one after another, and records for each run its accuracy,
wall seconds (process start to exit), epochs done, threads and the 1-minute load average before it, with the
machine (CPU, vector ISA, native bf16). Writes benchmarks/results/targets_NAME.json, which
`python -m vit_course results` turns into the README's and the book's table of seeds. One run at a time: on a
shared machine the load decides how many epochs fit in the budget, so it is recorded with the numbers.

    python benchmarks/targets.py mnist --runs 3
    python benchmarks/targets.py cifar10 --runs 3 --out runs/bench
    python benchmarks/targets.py cifar10 --seeds 1 2 --append   # more seeds beside the stored ones
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, wait_for_quiet

from vit_course.files import write_json
from vit_course.results import one_view_accuracy

TARGETS = {"mnist": (0.993, 300), "cifar10": (0.80, 1800)}


def run_once(name, seed, out):
    """One whole command, timed from outside, once the load of the last one has faded from the load average (which
    the command reads to choose its threads): -> a dict of what the run reports."""
    waited = wait_for_quiet()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vit_course", "train", name, "--seed", str(seed), "--out", str(out),
                    "--no-progress"], check=True)
    wall = time.perf_counter() - started
    metrics = json.loads((Path(out) / "metrics.json").read_text())
    return {"seed": seed, "test_accuracy": metrics["test_accuracy"], "wall_seconds": round(wall, 1),
            "test_accuracy_one_view": one_view_accuracy(metrics),
            "epochs": metrics["epochs"], "precision": metrics.get("precision", "fp32"),
            "threads": metrics.get("threads"), "load_before": round(load, 2), "waited_seconds": waited,
            "machine": metrics.get("machine")}


def summary(name, runs):
    """The targets and the runs' mean, spread and worst wall time."""
    accuracy_target, seconds_target = TARGETS[name]
    accuracies, walls = [r["test_accuracy"] for r in runs], [r["wall_seconds"] for r in runs]
    return {"recipe": name, "target": {"test_accuracy": accuracy_target, "wall_seconds": seconds_target},
            "mean_accuracy": statistics.mean(accuracies), "min_accuracy": min(accuracies),
            "max_accuracy": max(accuracies), "std_accuracy": statistics.stdev(accuracies) if len(runs) > 1 else 0.0,
            "max_wall_seconds": max(walls), "runs": runs}


def main(argv=None, run=run_once):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="runs/bench", help="where the runs write their models")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where targets_NAME.json goes")
    parser.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of 0..runs-1")
    parser.add_argument("--append", action="store_true",
                        help="keep the other seeds already in targets_NAME.json (a seed run again is replaced)")
    args = parser.parse_args(argv)
    accuracy_target, seconds_target = TARGETS[args.name]
    path = args.results / f"targets_{args.name}.json"
    seeds = args.seeds if args.seeds is not None else range(args.runs)
    kept = [r for r in json.loads(path.read_text())["runs"] if r["seed"] not in seeds] if args.append else []
    runs = []
    for seed in seeds:
        result = run(args.name, seed, Path(args.out) / f"{args.name}-seed{seed}")
        runs.append(result)
        ok = result["test_accuracy"] >= accuracy_target and result["wall_seconds"] <= seconds_target
        print(f"seed {seed}: {result['test_accuracy']:.2%} in {result['wall_seconds']:.0f} s wall, "
              f"{result['epochs']:.2f} epochs, {result['threads']} threads, load {result['load_before']:.1f} -> "
              f"{'meets' if ok else 'misses'} the target", flush=True)
    result = summary(args.name, sorted(kept + runs, key=lambda r: r["seed"]))
    write_json(path, result)
    print(f"{args.name}: accuracy mean {result['mean_accuracy']:.2%}, std {result['std_accuracy']:.2%} (min "
          f"{result['min_accuracy']:.2%}, max {result['max_accuracy']:.2%}); wall max {result['max_wall_seconds']:.0f}"
          f" s (target {accuracy_target:.1%} in {seconds_target} s)")
    return result


if __name__ == "__main__":
    main()
