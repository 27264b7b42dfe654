"""What the small-data protocol of ``cifar10-plain`` costs per training step, part by part.

Times a whole training step (making the batch on the device, then forward, backward and AdamW) of the paper-style
ViT under four protocols, alternately in one process: crop + flip (``cifar10-plain-basic``'s), + RandAugment, + CutMix /
Mixup, and all of them with stochastic depth (``cifar10-plain``'s). Alternating spreads the machine's drifts
over all four; the ratios to crop + flip are what carries over to another machine. ``--record`` writes
benchmarks/results/plain_protocol_cost.json.

    python benchmarks/plain_protocol.py [--rounds 8] [--steps 4] [--threads 2] [--record]
"""

import argparse
import functools
import json
import statistics
import time

import torch
from common import RESULTS
from machine import machine

from vit_course import ViT
from vit_course.augment import mix_batch
from vit_course.batches import cifar_augment, loaders
from vit_course.files import write_json
from vit_course.recipes import RECIPES
from vit_course.train import param_groups, train_step


def protocols():
    """name -> (model config, augment keywords, mix keywords or None), from the two recipes."""
    basic, strong = RECIPES["cifar10-plain-basic"], RECIPES["cifar10-plain"]
    return {
        "crop+flip": (basic["model"], basic["augment"], None),
        "+randaugment": (basic["model"], strong["augment"], None),
        "+mix": (basic["model"], basic["augment"], strong["mix"]),
        "all (+drop path)": (strong["model"], strong["augment"], strong["mix"]),
    }


def measure(rounds, steps, threads, batch_size=128):
    """Seconds per training step of each protocol, ``steps`` at a time, alternated for ``rounds`` rounds."""
    torch.set_num_threads(threads)
    runs = {}
    for name, (config, augment, mix) in protocols().items():
        torch.manual_seed(0)
        model = ViT(**config)
        train, *_ = loaders("cifar10", batch_size, device="cpu", augment=functools.partial(cifar_augment, **augment),
                           mix=functools.partial(mix_batch, num_classes=10, **mix) if mix else None)
        runs[name] = (model, torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3), iter(train))
    times = {name: [] for name in runs}
    for _ in range(rounds + 1):  # the first round warms up and is not kept
        for name, (model, optimizer, batches) in runs.items():
            tick = time.perf_counter()
            for _ in range(steps):
                x, y = next(batches)
                train_step(model, x, y, optimizer, label_smoothing=0.1)
            times[name].append((time.perf_counter() - tick) / steps)
    times = {name: values[1:] for name, values in times.items()}
    base = statistics.median(times["crop+flip"])
    return {"machine": machine(), "threads": threads, "batch_size": batch_size, "rounds": rounds, "steps": steps,
            "seconds_per_step": {name: [round(t, 4) for t in values] for name, values in times.items()},
            "median_ms": {name: round(1000 * statistics.median(values), 1) for name, values in times.items()},
            "ratio_to_crop_flip": {name: round(statistics.median(values) / base, 3) for name, values in times.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--record", action="store_true", help="write RESULTS/plain_protocol_cost.json")
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.steps, args.threads)
    print(json.dumps({k: result[k] for k in ("median_ms", "ratio_to_crop_flip")}, indent=1))
    if args.record:
        write_json(RESULTS / "plain_protocol_cost.json", result)
    return result


if __name__ == "__main__":
    main()
