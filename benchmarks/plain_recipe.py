"""How the paper-style ViT's width was chosen: the cost of a training step of candidate widths, and short runs.

The candidates vary ``cifar10-plain-basic``'s network (``cifar10-plain`` is the same network, trained longer and
harder).

``--speed`` times one training step (batch 128, 2 threads) of each candidate config in one process, alternately
and repeatedly, in float32 and under bfloat16 autocast: how many epochs each candidate gets from the same hours
(with ``--record``, into benchmarks/results/plain_recipe_speed.json). ``--runs`` trains each candidate for a short
time budget (``benchmarks/ablate.py`` in a fresh process, one after another); with ``--record`` it appends them to
benchmarks/results/plain_recipe.json. Short runs favour small, fast models, and both measurements need the
machine to themselves: another process on the cores halves a candidate's speed.

    python benchmarks/plain_recipe.py --speed --record
    python benchmarks/plain_recipe.py --runs --budget 390 --only width-192 --record
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS

from vit_course.files import write_json

HERE = Path(__file__).resolve().parent

CANDIDATES = {  # name -> changes to the recipe's model (--set model.KEY=VALUE for the short runs)
    "recipe": {},
    "width-192": {"dim": 192, "num_heads": 3},
    "width-192-mlp4": {"dim": 192, "num_heads": 3, "mlp_ratio": 4.0},
    "width-256": {"dim": 256, "num_heads": 4},
    "heads-8": {"num_heads": 8},
}


def speed(rounds=3, steps=4, threads=2):
    """Seconds per training step of every candidate, fp32 and bf16 autocast, measured alternately."""
    import torch
    import torch.nn.functional as F

    from vit_course import ViT, param_groups
    from vit_course.recipes import RECIPES

    torch.set_num_threads(threads)
    base = RECIPES["cifar10-plain-basic"]["model"]
    x, y = torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))
    models = {name: ViT(**{**base, **change}) for name, change in CANDIDATES.items()}
    optimizers = {name: torch.optim.AdamW(param_groups(m, 0.05), lr=1e-3) for name, m in models.items()}

    def step(name, amp):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = models[name](x)
        loss = F.cross_entropy(logits.float(), y)
        optimizers[name].zero_grad()
        loss.backward()
        optimizers[name].step()

    times = {}
    for _ in range(rounds):
        for name in CANDIDATES:
            for amp in (False, True):
                step(name, amp)  # warm-up
                tick = time.perf_counter()
                for _ in range(steps):
                    step(name, amp)
                times.setdefault(f"{name}/{'bf16' if amp else 'fp32'}", []).append((time.perf_counter() - tick) / steps)
    from machine import machine

    return {"machine": machine(), "threads": threads, "batch_size": 128, "seconds_per_step": times,
            "params": {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()},
            "median_epoch_seconds": {k: round(390 * statistics.median(v), 1) for k, v in times.items()}}


def runs(names, budget, seed, threads):
    """Short runs of each candidate at one budget, one process after another; -> list of result dicts."""
    results = []
    for name in names:
        command = [sys.executable, str(HERE / "ablate.py"), "cifar10-plain-basic", "--budget", str(budget), "--seed",
                   str(seed), "--out", f"runs/plain_recipe/{name}", "--threads", str(threads)]
        for key, value in CANDIDATES[name].items():
            command += ["--set", f"model.{key}={value!r}"]
        line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results.append({"candidate": name, "budget": budget, **json.loads(line)})
        print(json.dumps(results[-1]), flush=True)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", action="store_true", help="time a step of every candidate")
    parser.add_argument("--runs", action="store_true", help="short training runs of the candidates")
    parser.add_argument("--budget", type=float, default=390, help="seconds for each whole run")
    parser.add_argument("--only", action="append", choices=sorted(CANDIDATES), help="run only these")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="store the answer in benchmarks/results/")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads, fixed so a brief blip at start-up cannot halve a candidate's speed")
    args = parser.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    if args.speed:
        result = speed(threads=args.threads)
        if args.record:
            write_json(RESULTS / "plain_recipe_speed.json", result)
        print(json.dumps(result["median_epoch_seconds"], indent=1))
    if args.runs:
        path = RESULTS / "plain_recipe.json"
        done = json.loads(path.read_text()) if path.is_file() else []
        done += runs(args.only or list(CANDIDATES), args.budget, args.seed, args.threads)
        if args.record:
            write_json(path, done)


if __name__ == "__main__":
    main()
