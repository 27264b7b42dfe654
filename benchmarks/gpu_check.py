"""Does the whole course run on a GPU? Every chapter, the recipes, both 16-bit precisions and the timm parity test.

    python benchmarks/gpu_check.py                     # on a machine with one NVIDIA GPU: at most about 8 minutes
    python benchmarks/gpu_check.py --smoke --out F     # the same steps, tiny, on whatever device is here

Run from a fresh copy of the repository, with PyTorch installed and the datasets where ``VIT_COURSE_DATA`` points
(MNIST whole; a recompressed copy of CIFAR-10 will do: ``--data`` says which, and the record keeps it). Besides the
package's dependencies it needs timm and pytest (the parity step); it needs no network.

The steps, each recorded with ``ok``, ``seconds`` and ``error``:
- notebook 01..09: the solution notebook run top to bottom in a fresh kernel (nbclient), as a learner's "Run all";
  its setup cell must report the GPU. The full check runs them beside the recipes, three at a time.
- recipe mnist, cifar10, cifar10-gpu, cifar10-fast: ``python -m vit_course train NAME`` on the device's plan
  (``recipes.plan``), with ``--recipe-seconds`` as a time budget, so a plan that would not fit the check ends
  early, decayed, and is recorded as such (``epochs`` done of ``planned_epochs``, ``shortened``); ``accuracy`` on
  the test set; the whole plan's seconds as ``recipes.estimate_seconds`` foresees them and at the pace the run kept;
  ``whole_step_fallback``: on CUDA, why the compiled whole step fell back to the model compiled alone (None: none).
- precision float16+scaler (what a T4 trains in) and bfloat16: 20 training steps of the cifar10 recipe's model on
  real images in that precision, which must leave a finite, lower loss.
- parity timm: tests/test_timm.py (our ViT against timm's, weights converted) with the GPU as default device.
- stability: ``race_stability.py`` on the mean-pooled plain ViT (chapter 07's former twin, the last check's one
  failure) at 2e-3 and 1e-3, four seeds each; ok when no run at 1e-3 diverged, every run's line recorded.
``--smoke`` shrinks the recipes to one epoch on 512 images; the notebooks run as they are (a CPU's "Run all").
Writes ``benchmarks/results/gpu_check.json`` (``--out``): device, torch, smoke, data, steps.
"""

# ruff: noqa: E402 (common puts this checkout on the path first)
import argparse
import concurrent.futures
import importlib.util
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import nullcontext
from pathlib import Path

import common
import nbformat
import torch

from vit_course import DeviceLoader, ViT, load, load_examples, pick_device
from vit_course.data import DATASETS
from vit_course.device import amp_settings
from vit_course.files import write_json
from vit_course.kernel import run
from vit_course.recipes import RECIPES, estimate_seconds, plan, train_recipe
from vit_course.train import train_step

NOTEBOOKS = sorted((common.ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
CHECK_RECIPES = ("mnist", "cifar10", "cifar10-gpu", "cifar10-fast")
PRECISIONS = {"float16+scaler": ("fp16", torch.float16), "bfloat16": ("bf16", torch.bfloat16)}


def step(kind, name, work):
    """Run ``work()`` (-> dict of results) as one step: -> {"kind", "name", "ok", "seconds", ...results, "error"}."""
    tick = time.perf_counter()
    try:
        record, ok, error = work(), True, None
    except Exception as failure:  # noqa: BLE001  (a step that fails is recorded, and the check goes on)
        record, ok, error = {}, False, "".join(traceback.format_exception_only(failure)).strip()[-2000:]
    record = {"kind": kind, "name": name, "ok": ok, "seconds": round(time.perf_counter() - tick, 1), **record}
    if error:
        record["error"] = error
    print(f"{'ok  ' if ok else 'FAIL'} {kind} {name}: {record['seconds']:.0f} s"
          + "".join(f", {k} {v}" for k, v in record.items() if k in ("accuracy", "epochs", "loss")), flush=True)
    if error:
        print("     " + error.replace("\n", "\n     "), flush=True)
    return record


def notebook(path, device):
    """Run the solution notebook at ``path`` in a fresh kernel (cwd: a fresh folder); its setup cell must print the
    device this check runs on."""
    def work():
        missing = [name for name in ("nbclient", "ipykernel") if importlib.util.find_spec(name) is None]
        if missing:
            raise RuntimeError(f"running a notebook needs {' and '.join(missing)} (dependencies of the package: "
                               "`pip install -e .`, or their wheels on a machine without network)")
        nb = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory() as folder:
            try:
                run(nb, folder, timeout=600)
            except Exception as failure:  # the cell that failed and its exception's line, not the coloured traceback
                failed = [(i, o) for i, cell in enumerate(nb.cells) for o in cell.get("outputs", [])
                          if o.get("output_type") == "error"]
                if not failed:
                    raise
                cell, error = failed[0]
                raise RuntimeError(f"cell {cell}: {error['ename']}: {error['evalue']}") from failure
        printed = "".join(output.get("text", "") for output in nb.cells[1].get("outputs", []))
        if f"Using device: {device.type}" not in printed:
            raise RuntimeError(f"the setup cell printed {printed.strip()!r}, not the device {device.type!r}")
        return {}
    return work


def recipe(name, device, seconds, smoke, out):
    """Train recipe ``name`` on the device's plan, within ``seconds`` (smoke: one epoch on 512 images)."""
    def work():
        planned = 1 if smoke else plan(name, device)[0]
        estimate = estimate_seconds(name, device, epochs=planned, steps=3 if smoke else 20)  # what chapter 07 prints
        with warnings.catch_warnings(record=True) as caught:  # fit warns if its compiled step falls back
            warnings.simplefilter("always")
            metrics = train_recipe(name, epochs=planned, out=out / name, device=device,
                                   time_budget=None if smoke else seconds, subset=512 if smoke else None,
                                   progress=False)
        fallback = [str(w.message) for w in caught if "do not compile into one graph" in str(w.message)]
        return {"accuracy": round(metrics["test_accuracy"], 4), "epochs": round(metrics["epochs"], 2),
                "whole_step_fallback": fallback[0] if fallback else None,  # None: compiled whole, or not compiled
                "planned_epochs": planned, "shortened": metrics["epochs"] < planned,
                "precision": metrics["precision"], "train_seconds": metrics["train_seconds"],
                "estimated_plan_seconds": round(estimate, 1),  # estimate_seconds: timed steps, scaled to the plan
                "paced_plan_seconds": round(metrics["train_seconds"] / metrics["epochs"] * planned, 1)}
    return work


def precision_steps(label, device, steps=20):
    """``steps`` training steps of the cifar10 recipe's model in 16-bit precision ``label``, as ``fit`` runs them
    (autocast around the step; float16 with a GradScaler): the loss must stay finite and fall."""
    def work():
        kind, dtype = PRECISIONS[label]
        if device.type == "cuda":
            autocast, scaler = amp_settings(kind, device)  # the package's own rule, as fit uses it
        else:  # float16 autocast is CUDA-only in the package; the smoke run tries the same calls on this device
            autocast = torch.autocast(device.type, dtype=dtype)
            scaler = torch.amp.GradScaler(device.type) if kind == "fp16" else None
        config = RECIPES["cifar10"]["model"]
        images, labels = load_examples()  # (512, 3, 32, 32) uint8, (512,)
        meta = DATASETS["cifar10"]
        batches = DeviceLoader(images, labels, 64, shuffle=True, drop_last=True, mean=meta["mean"], std=meta["std"],
                               device=device, seed=0)
        torch.manual_seed(0)
        model = ViT(**config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with autocast or nullcontext(), torch.no_grad():
            produced = model(next(iter(batches))[0]).dtype
        if produced != dtype:
            raise RuntimeError(f"under autocast the model computed in {produced}, not {dtype}")
        losses = []
        while len(losses) < steps:
            for x, y in batches:
                with autocast or nullcontext():
                    losses.append(float(train_step(model, x, y, optimizer, 0.0, scaler)))
                if len(losses) == steps:
                    break
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        if not all(math.isfinite(loss) for loss in losses) or last >= first:
            raise RuntimeError(f"the loss did not fall: first five steps {first:.3f}, last five {last:.3f}")
        return {"loss": [round(first, 6), round(last, 6)], "dtype": str(dtype).removeprefix("torch."),
                **({"loss_scale": scaler.get_scale()} if scaler is not None else {})}
    return work


def parity(device):
    """tests/test_timm.py with ``device`` as torch's default device (tests/conftest.py: VIT_COURSE_TEST_DEVICE)."""
    def work():
        env = dict(os.environ, VIT_COURSE_TEST_DEVICE=device.type)
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_timm.py"],
                              cwd=common.ROOT, env=env, capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or [""])[-1]
        if done.returncode != 0 or "skipped" in last:
            raise RuntimeError(f"pytest tests/test_timm.py: {last}\n{done.stdout[-1500:]}{done.stderr[-500:]}")
        return {"pytest": last}
    return work


def stability(smoke):
    """benchmarks/race_stability.py: the mean-pooled plain ViT (the twin chapter 07 once trained, which diverged in the
    last GPU check) for a minute at 2e-3 and at 1e-3, four seeds each (smoke: one 5-second run). ok when no run at
    1e-3 diverged."""
    def work():
        grid = ["--seconds", "5", "--seeds", "0", "--lr", "1e-3", "--parallel", "1"] if smoke else \
            ["--seconds", "60", "--seeds", "0", "1", "2", "3", "--lr", "2e-3", "1e-3", "--parallel", "8"]
        done = subprocess.run([sys.executable, "benchmarks/race_stability.py", "--models", "mean", *grid],
                              cwd=common.ROOT, capture_output=True, text=True)
        runs = [line for line in done.stdout.splitlines() if line.startswith("model ")]
        if done.returncode != 0 or not runs:
            raise RuntimeError(f"race_stability.py: {done.stdout[-1000:]}{done.stderr[-1000:]}")
        diverged = [line for line in runs if "lr 0.001 " in line and "became" in line]
        if diverged:
            raise RuntimeError("diverged at the GPU rate: " + "; ".join(diverged))
        return {"runs": runs}
    return work


def commit():
    """The checkout's commit, where git and the history are there (a copy without .git: None)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=common.ROOT, capture_output=True, text=True)
    except OSError:  # no git on this machine
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def describe_data():
    """Which CIFAR-10 copy VIT_COURSE_DATA holds, by its first 512 test images against the package's examples (the
    course's copy): the same labels and pixels (the course's), the same labels (a recompressed copy), or neither."""
    images, labels = load("cifar10", split="test", download=False)
    examples, example_labels = load_examples()
    if not torch.equal(labels[:512], example_labels):
        return {"cifar10": "another order than the course's copy (the official files?)"}
    difference = (images[:512].float() - examples.float()).abs().mean().item()
    return {"cifar10": "the course's copy" if difference == 0 else "the course's images in its order, recompressed",
            "cifar10_mean_abs_difference": round(difference, 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny recipes, on whatever device is here")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "gpu_check.json")
    parser.add_argument("--only", nargs="+", choices=["notebook", "recipe", "precision", "parity", "stability"],
                        help="these kinds of step only (default: all)")
    parser.add_argument("--notebooks", nargs="+", metavar="NN", help="these notebooks only, e.g. 01 06")
    parser.add_argument("--recipe-seconds", type=float, default=150, help="time budget of each recipe (full check)")
    parser.add_argument("--data", default="", help="where the datasets came from, for the record")
    args = parser.parse_args(argv)
    device = pick_device()
    if device.type != "cuda" and not args.smoke:
        parser.error(f"the full check needs a CUDA GPU (this machine's device is {device.type}): add --smoke")
    kinds = set(args.only or ["notebook", "recipe", "precision", "parity", "stability"])
    started = time.perf_counter()
    record = {"device": torch.cuda.get_device_name() if device.type == "cuda" else device.type,
              "torch": str(torch.__version__), "python": platform.python_version(), "smoke": args.smoke,
              "command": " ".join(["python benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "commit": commit(),
              "data": {"note": args.data, **describe_data()}, "recipe_seconds": None if args.smoke else
              args.recipe_seconds, "steps": []}
    print(f"GPU check on {record['device']} (torch {record['torch']}){', smoke' if args.smoke else ''}", flush=True)
    chosen = [p for p in NOTEBOOKS if not args.notebooks or p.name[:2] in args.notebooks]
    workers = 1 if args.smoke else 3  # a CPU has no room to spare; the GPU machine runs chapters beside recipes
    with tempfile.TemporaryDirectory() as runs, concurrent.futures.ThreadPoolExecutor(workers) as pool:
        pending = [pool.submit(step, "notebook", p.name[:2], notebook(p, device))
                   for p in chosen if "notebook" in kinds] if not args.smoke else []
        steps = []
        if "recipe" in kinds:
            steps += [step("recipe", name, recipe(name, device, args.recipe_seconds, args.smoke, Path(runs)))
                      for name in CHECK_RECIPES]
        if "precision" in kinds:
            steps += [step("precision", label, precision_steps(label, device)) for label in PRECISIONS]
        if "parity" in kinds:
            steps.append(step("parity", "timm", parity(device)))
        if "stability" in kinds:
            steps.append(step("stability", "mean-pooled ViT", stability(args.smoke)))
        if args.smoke and "notebook" in kinds:
            steps += [step("notebook", p.name[:2], notebook(p, device)) for p in chosen]
        steps += [future.result() for future in pending]
    order = ["notebook", "recipe", "precision", "parity", "stability"]
    record["steps"] = sorted(steps, key=lambda s: (order.index(s["kind"]), s["name"]))
    record["seconds"] = round(time.perf_counter() - started, 1)
    write_json(args.out, record)
    failed = [f"{s['kind']} {s['name']}" for s in record["steps"] if not s["ok"]]
    print(f"{len(record['steps']) - len(failed)} of {len(record['steps'])} steps ok in {record['seconds']:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"; wrote {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
