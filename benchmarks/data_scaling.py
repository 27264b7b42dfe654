"""The ViT paper's data claim (its section 4.3) on CIFAR-10: three models on growing training sets, early stopping.

Protocol, as the paper's: the same hyper-parameters at every size and no extra regularisation for small sets,
each run trained until its validation accuracy stops improving and reported at its best validation round.
- Validation: 5,000 training images held out (the first of one fixed shuffle, seed 0), never the test set.
- Training sets: nested subsets of the other 45,000 (the first N of that shuffle), ``SIZES``.
- Every run: AdamW (lr 1e-3, weight decay 0.05, 500 warmup steps, then constant), label smoothing 0.1, batches
  of 128, random crop (padding 4) and flip. A *round* is one pass over the subset, repeated to at least 10,000
  images so that a small set is judged on enough steps; after every round, the validation accuracy. After
  ``--patience`` rounds without a new best the learning rate drops tenfold once; after as many more the run stops.
  The test accuracy is that of the best round's weights.
- Models (``MODELS``, sized alike): ``vit`` the paper's architecture (patch 4 on 32 px: an 8x8 grid, class token,
  learned positions, 6 blocks; width ``--width``, narrower than ``cifar10-plain`` to fit the compute); ``hybrid``
  the same transformer behind a conv stem of two stages (32, 64), which also leaves an 8x8 grid of 64 tokens, so
  the two differ only in how tokens are made; ``cnn`` ``baselines.small_resnet`` (14 layers).
- Chapter 08's question (Raghu et al. 2021: less data, fewer local heads): each ``vit`` run also records every
  head's mean attention distance at its best round, as a share of uniform attention's, on the first 512 test
  images (``plain_findings.py``'s definition). A ``vit`` run finished before this was recorded is trained again.

Writes benchmarks/results/data_scaling.json, one run at a time, each finished run added at once (the runs in seed,
size, model order); the run in progress checkpoints after every round in --work, so a stopped command resumes where
it stopped. Chapter 07 draws it. ``--plan`` times each model's training step first (alternately) and prints the
compute a seed will take.

    python benchmarks/data_scaling.py --plan
    python benchmarks/data_scaling.py --seeds 0 1          # resumes: finished runs are skipped
    python benchmarks/data_scaling.py --smoke --out /tmp/scaling.json   # seconds, on a sliver of the data
"""

import argparse
import copy
import functools
import json
import math
import time
from pathlib import Path

import torch
from common import RESULTS, distance_ratios, step_times
from machine import machine

from vit_course import DATASETS, ViT, load
from vit_course.baselines import small_resnet
from vit_course.batches import DeviceLoader, cifar_augment, normalize
from vit_course.files import atomic_write, write_json
from vit_course.train import evaluate, param_groups, train_step

OUT = RESULTS / "data_scaling.json"
VALIDATION, SIZES, ROUND_IMAGES = 5000, (1000, 2500, 5000, 11250, 22500, 45000), 10_000
SETTINGS = dict(lr=1e-3, weight_decay=0.05, warmup_steps=500, label_smoothing=0.1, batch_size=128)


def transformer(width, **changes):
    """The plain ViT of width ``width`` (patch 4 on 32 px, 6 blocks, 4 heads), with ``changes`` to its settings."""
    return ViT(**{**dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=width, depth=6,
                         num_heads=4, mlp_ratio=2.0, pool="cls", pos_embed="learned"), **changes})


MODELS = {
    "vit": lambda width: transformer(width),
    "hybrid": lambda width: transformer(width, patch_size=1, stem_channels=(32, 64)),  # 32 -> 16 -> 8: 8x8 tokens
    "cnn": lambda width: small_resnet(channels=(width // 4, width // 2, width)),
}


def splits(smoke=False):
    """-> (pool images, pool labels, validation loader, test loader, probe): the 45,000, the 5,000 held out, the
    test set, and its first 512 images normalised (for the attention distances)."""
    images, labels = load("cifar10", "train")
    test_images, test_labels = load("cifar10", "test")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))  # one shuffle: nested subsets
    val, pool = order[:VALIDATION], order[VALIDATION:]
    if smoke:
        val, pool, test_images, test_labels = val[:128], pool[:512], test_images[:128], test_labels[:128]
    meta = DATASETS["cifar10"]
    batches = functools.partial(DeviceLoader, batch_size=500, mean=meta["mean"], std=meta["std"], device="cpu")
    probe = normalize(test_images[:512], meta["mean"], meta["std"])
    return images[pool], labels[pool], batches(images[val], labels[val]), batches(test_images, test_labels), probe


def round_loader(images, labels, seed):
    """The training batches of one round: the subset repeated to at least ROUND_IMAGES, shuffled, augmented."""
    repeats = math.ceil(ROUND_IMAGES / len(labels))
    meta = DATASETS["cifar10"]
    return DeviceLoader(images.repeat(repeats, 1, 1, 1), labels.repeat(repeats), SETTINGS["batch_size"],
                        shuffle=True, drop_last=True, seed=seed, mean=meta["mean"], std=meta["std"], device="cpu",
                        augment=functools.partial(cifar_augment, padding=4))


def train_run(model, train, val, patience, max_rounds, work):
    """Train until validation accuracy stops improving (see the module's docstring), checkpointing every round in
    ``work`` and resuming from it. -> state: rounds, steps, best_round, best_val, best weights, seconds, history."""
    optimizer = torch.optim.AdamW(param_groups(model, SETTINGS["weight_decay"]), lr=SETTINGS["lr"])
    state = {"rounds": 0, "steps": 0, "decayed_at": None, "best_round": 0, "best_val": -1.0, "best": None,
             "seconds": 0.0, "history": []}
    if work.is_file():
        saved = torch.load(work, weights_only=False)
        model.load_state_dict(saved.pop("model"))
        optimizer.load_state_dict(saved.pop("optimizer"))
        torch.set_rng_state(saved.pop("rng"))
        state = saved
    if machine() not in state.setdefault("machines", [])[-1:]:
        state["machines"].append(machine())  # a run resumed in another session may finish on another CPU
    started = time.perf_counter() - state["seconds"]
    while state["rounds"] < max_rounds:
        train.set_epoch(state["rounds"])
        decay = 0.1 if state["decayed_at"] is not None else 1.0
        for x, y in train:
            warmup = min(1.0, (state["steps"] + 1) / SETTINGS["warmup_steps"])
            for group in optimizer.param_groups:
                group["lr"] = SETTINGS["lr"] * warmup * decay
            train_step(model, x, y, optimizer, SETTINGS["label_smoothing"])
            state["steps"] += 1
        state["rounds"] += 1
        _, accuracy = evaluate(model, val)
        state["history"].append(round(accuracy, 4))
        if accuracy > state["best_val"]:
            state.update(best_val=accuracy, best_round=state["rounds"], best=copy.deepcopy(model.state_dict()))
        waited = state["rounds"] - max(state["best_round"], state["decayed_at"] or 0)
        stop = waited >= patience and state["decayed_at"] is not None
        if waited >= patience and state["decayed_at"] is None:
            state["decayed_at"] = state["rounds"]  # the plateau: a tenfold lower rate, patience counted afresh
        state["seconds"] = time.perf_counter() - started
        saved = {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "rng": torch.get_rng_state()}
        atomic_write(work, functools.partial(torch.save, saved))
        if stop:
            break
    return state


def one_run(name, width, seed, images, labels, val, test, patience, max_rounds, work, probe):
    """Train model ``name`` on (images, labels) with ``seed``; -> the result row of the run."""
    torch.manual_seed(seed)  # weights, dropout; the loader's order and augmentation follow its own seed
    model = MODELS[name](width)
    train = round_loader(images, labels, seed)
    state = train_run(model, train, val, patience, max_rounds, work)
    model.load_state_dict(state["best"])
    _, test_accuracy = evaluate(model, test)
    round_images = len(train) * SETTINGS["batch_size"]
    return {"model": name, "seed": seed, "images": len(labels), "rounds": state["rounds"],
            "best_round": state["best_round"], "epochs": round(state["rounds"] * round_images / len(labels), 2),
            "best_epoch": round(state["best_round"] * round_images / len(labels), 2), "steps": state["steps"],
            "decayed_at": state["decayed_at"], "val_accuracy": round(state["best_val"], 4),
            "test_accuracy": round(test_accuracy, 4), "seconds": round(state["seconds"], 1),
            "machines": state["machines"],
            "params": sum(p.numel() for p in model.parameters()), "val_history": state["history"],
            **(distances(model, probe) if name == "vit" else {})}


def distances(model, probe):
    """``distance_ratios`` on ``probe`` (layers x heads), and the smallest of the first two layers."""
    ratios = distance_ratios(model, probe)  # (L, h)
    return {"distance_ratio": [[round(r, 3) for r in row] for row in ratios.tolist()],
            "min_ratio_layers_1_2": round(ratios[:2].min().item(), 3)}


def plan(width, rounds=10):
    """Seconds per training step of each model (batch 128, alternated over ``rounds``), and what a seed costs
    if every run stops after about 40 rounds of at least 10,000 images."""
    steps = {}
    for name in MODELS:
        torch.manual_seed(0)
        model = MODELS[name](width).train()
        optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
        x, y = torch.randn(SETTINGS["batch_size"], 3, 32, 32), torch.randint(0, 10, (SETTINGS["batch_size"],))
        steps[name] = functools.partial(train_step, model, x, y, optimizer)
    per_step = step_times(steps, rounds)
    for name, s in per_step.items():
        round_steps = [max(ROUND_IMAGES, n) // SETTINGS["batch_size"] for n in SIZES]
        hours = s * 40 * sum(round_steps) / 3600
        print(f"{name}: {1000 * s:.0f} ms a step; one seed over {len(SIZES)} sizes at ~40 rounds: ~{hours:.1f} h")
    return per_step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--sizes", type=int, nargs="+", help=f"training-set sizes (default: {list(SIZES)})")
    parser.add_argument("--width", type=int, default=64, help="the transformers' width; the ResNet's last stage")
    parser.add_argument("--patience", type=int, default=5, help="rounds without a new best before a decay / stop")
    parser.add_argument("--max-rounds", type=int, default=150)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=Path("runs/data_scaling"), help="the run in progress")
    parser.add_argument("--plan", action="store_true", help="time the models' steps and print the compute")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a sliver of the data, for the tests")
    args = parser.parse_args(argv)
    if args.plan:
        return plan(args.width)
    if args.smoke:
        global ROUND_IMAGES
        ROUND_IMAGES, args.max_rounds, args.patience = 256, 3, 1
    args.sizes = args.sizes or ([256, 512] if args.smoke else list(SIZES))
    images, labels, val, test, probe = splits(args.smoke)
    if max(args.sizes) > len(labels):
        raise ValueError(f"a training set of {max(args.sizes)} images: only {len(labels)} are left beside the "
                         f"{VALIDATION} held out for validation")
    stored = json.loads(args.out.read_text()) if args.out.exists() else {}
    header = {"validation_images": VALIDATION, "width": args.width, "patience": args.patience,
              "round_images": ROUND_IMAGES, "settings": SETTINGS, "machine": machine()}
    if stored and any(stored.get(k) != v for k, v in header.items() if k != "machine"):
        raise ValueError(f"{args.out} holds runs of other settings: "
                         f"{ {k: stored.get(k) for k in header if k != 'machine'} }; pass another --out")
    runs = [r for r in stored.get("runs", []) if r["model"] != "vit" or "distance_ratio" in r]  # see the docstring
    for seed in args.seeds:
        for size in args.sizes:
            for name in args.models:
                if any((r["model"], r["seed"], r["images"]) == (name, seed, size) for r in runs):
                    continue
                work = args.work / f"{name}-{size}-seed{seed}.pt"
                run = one_run(name, args.width, seed, images[:size], labels[:size], val, test, args.patience,
                              args.max_rounds, work, probe)
                runs.append(run)
                runs.sort(key=lambda r: (r["seed"], r["images"], list(MODELS).index(r["model"])))  # a stable order
                seeds = sorted({r["seed"] for r in runs})
                write_json(args.out, {**header, "seeds": seeds, "sizes": sorted({r["images"] for r in runs}),
                                      "runs": runs})
                work.unlink(missing_ok=True)
                print(json.dumps({k: v for k, v in run.items() if k != "val_history"}), flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
