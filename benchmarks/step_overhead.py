"""How much host work does one training step carry? Per recipe: dispatched operations, host reads, graph breaks, speed.

One step is what ``fit`` does for a batch: the loader's batch (gather, augmentation, normalisation, CutMix/Mixup
where the recipe mixes) and ``train.train_step`` (forward, loss, backward, AdamW), on random uint8 images of the
recipe's shape, on this machine's device. Counted over ``--steps`` steps after one warm-up, per step:

- ops: the PyTorch operations dispatched (``TorchDispatchMode`` sees each aten call): on a GPU each is at least one
  kernel launch, paid on the host whether the kernel is big or small;
- host reads: the calls that need a device value on the host (``.item()``, ``float()``, ``int()``, ``bool()``,
  ``.tolist()``, ``nonzero()``): on a GPU each waits until the device has caught up, so the host cannot queue the
  next kernels while the device works; on a CPU they are cheap, but they are the same calls;
- graph breaks: where ``torch.compile`` (``torch._dynamo.explain``) has to leave the graph: in the whole step that
  ``fit`` compiles on CUDA (``loop.whole_step``: gather, augment, normalise, mix, forward, loss, backward, AdamW), and,
  for comparison, in its pieces run eagerly: the model's forward, ``train_step`` and the loader's batch pipeline;
- images/s: eager, float32, timed alternately with the other recipes.

    python benchmarks/step_overhead.py                       # every recipe, a table
    python benchmarks/step_overhead.py mnist cifar10 --json  # as JSON (to paste into a note)
    python benchmarks/step_overhead.py mnist cifar10 cifar10-gpu cifar10-fast --record  # into the appendix

``--record`` appends the run, with its device, PyTorch and machine, to benchmarks/results/step_overhead.json,
which the appendix's ``step-overhead`` table reads.
"""

# ruff: noqa: E402
import argparse
import functools
import json
import time
from collections import Counter
from pathlib import Path

import common  # noqa: F401 (this checkout first on the path)
import torch
from common import RESULTS
from machine import load_average, machine
from torch.utils._python_dispatch import TorchDispatchMode

from vit_course.augment import mix_batch
from vit_course.batches import AUGMENT, DeviceLoader
from vit_course.data import DATASETS
from vit_course.files import append_run
from vit_course.loop import FUSED_ADAMW, whole_step
from vit_course.recipes import RECIPES
from vit_course.train import param_groups, train_step
from vit_course.vit import ViT

# aten ops that hand a device value to the host (each a sync on a GPU)
HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "equal", "is_nonzero"}


class Count(TorchDispatchMode):
    """Counts every aten op dispatched inside the ``with`` block, and the host reads among them."""

    def __init__(self):
        super().__init__()
        self.ops, self.reads = 0, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            self.reads[name] += 1
        return func(*args, **(kwargs or {}))


def count_tolist():
    """Patch ``Tensor.tolist`` (it reads the data without dispatching an op) to count its calls: -> (counter, undo)."""
    calls, original = Counter(), torch.Tensor.tolist

    def tolist(self):
        calls["tolist"] += 1
        return original(self)

    torch.Tensor.tolist = tolist
    return calls, lambda: setattr(torch.Tensor, "tolist", original)


def recipe_step(name, device):
    """-> (step() running one training step of recipe ``name``, the batch size, the step's pieces for explain)."""
    recipe = RECIPES[name]
    data, batch = DATASETS[recipe["dataset"]], recipe["train"]["batch_size"]
    torch.manual_seed(0)
    model = ViT(**recipe["model"]).to(device).train()
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3, fused=device.type in FUSED_ADAMW)  # as fit
    images = torch.randint(0, 256, (4 * batch, *data["shape"]), dtype=torch.uint8)  # (4b, C, H, W)
    labels = torch.randint(0, len(data["classes"]), (4 * batch,))
    augment = functools.partial(AUGMENT[recipe["dataset"]], **recipe.get("augment") or {})
    mix = recipe.get("mix")
    mix = functools.partial(mix_batch, num_classes=len(data["classes"]), **mix) if mix else None
    loader = DeviceLoader(images, labels, batch, shuffle=True, augment=augment, mix=mix, mean=data["mean"],
                          std=data["std"], device=device, drop_last=True)
    smoothing = recipe["train"]["label_smoothing"]
    batches = iter(())

    def next_batch():
        nonlocal batches
        batch_xy = next(batches, None)
        if batch_xy is None:
            batches = iter(loader)
            batch_xy = next(batches)
        return batch_xy

    def step():
        return train_step(model, *next_batch(), optimizer, smoothing)

    twin = ViT(**recipe["model"]).to(device).train()  # as fit builds it for the whole step: a tensor learning rate
    twin_optimizer = torch.optim.AdamW(param_groups(twin, 0.05), lr=torch.tensor(1e-3, device=device),
                                       foreach=device.type == "cuda", capturable=device.type == "cuda")
    whole = whole_step(twin, twin_optimizer, loader, smoothing, backend="eager")
    step.parts = {"whole_step": (whole.graphs["forward_backward"], loader.indices()[0]),
                  "whole_step_update": (whole.graphs["update"],), "forward": (model, next_batch()[0]),
                  "train_step": (functools.partial(train_step, model, optimizer=optimizer, label_smoothing=smoothing),
                                 *next_batch()), "batch": (next_batch,)}
    return step, batch


def measure(name, device, steps):
    """-> {"ops", "host_reads", "reads_by_op", "graph_breaks"} per step of recipe ``name``."""
    step, batch = recipe_step(name, device)
    step()  # warm-up: the first step allocates AdamW's state
    tolist, undo = count_tolist()
    try:
        with Count() as count:
            for _ in range(steps):
                step()
    finally:
        undo()
    reads = count.reads + tolist
    breaks, graphs, reasons = {}, {}, set()
    for part, (fn, *inputs) in step.parts.items():
        with torch._dynamo.config.patch(trace_autograd_ops=part.startswith("whole_step")):  # as whole_step does
            explained = torch._dynamo.explain(fn)(*inputs)
        torch._dynamo.reset()
        breaks[part], graphs[part] = explained.graph_break_count, explained.graph_count
        reasons |= {f"{part}: " + str(b.reason).split("\n")[0][:90] for b in explained.break_reasons}
    whole = ("whole_step", "whole_step_update")  # the compiled step's two functions
    return {"ops": round(count.ops / steps, 1), "host_reads": round(sum(reads.values()) / steps, 1),
            "reads_by_op": {k: round(v / steps, 2) for k, v in sorted(reads.items())},
            "whole_step": {"graphs": sum(graphs.pop(k) for k in whole), "breaks": sum(breaks.pop(k) for k in whole)},
            "graph_breaks": breaks, "break_reasons": sorted(reasons), "batch": batch}


def speeds(names, device, rounds):
    """Images a second of each recipe's step, eager, timed in turn ``rounds`` times: -> {name: [per round]}."""
    steps = {name: recipe_step(name, device) for name in names}
    for step, _ in steps.values():
        step(), step()
    out = {name: [] for name in names}
    for _ in range(rounds):
        for name, (step, batch) in steps.items():
            tick = time.perf_counter()
            for _ in range(3):
                loss = step()
            float(loss)  # wait for the device before reading the clock
            out[name].append(3 * batch / (time.perf_counter() - tick))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipes", nargs="*", default=list(RECIPES))
    parser.add_argument("--steps", type=int, default=3, help="steps counted per recipe")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (each 3 steps per recipe)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--record", action="store_true", help="append the run to RESULTS/step_overhead.json")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where --record writes")
    args = parser.parse_args(argv)
    from vit_course.device import pick_device

    device = pick_device(args.device)
    timed = speeds(args.recipes, device, args.rounds)  # first: after torch._dynamo.explain, eager steps run slower
    rows = {name: measure(name, device, args.steps) for name in args.recipes}
    for name, per_round in timed.items():
        per_round = sorted(per_round)
        rows[name]["images_per_s"] = round(per_round[len(per_round) // 2])
        rows[name]["images_per_s_range"] = [round(per_round[0]), round(per_round[-1])]
    run = {"device": str(device), "torch": torch.__version__, "machine": machine(), "cpu_load": load_average(),
           "recipes": rows}
    if args.record:
        append_run(args.results / "step_overhead.json", run)
    if args.json:
        print(json.dumps(run, indent=1))
        return
    print(f"device {device}, torch {torch.__version__}; per training step:")
    print(f"{'recipe':22s} {'ops':>6s} {'host reads':>10s} {'whole step: graphs, breaks':>27s} "
          f"{'breaks in forward, train_step, batch':>37s} {'images/s':>9s}  reads by op")
    for name, r in rows.items():
        whole = f"{r['whole_step']['graphs']}, {r['whole_step']['breaks']}"
        pieces = ", ".join(str(n) for n in r["graph_breaks"].values())
        print(f"{name:22s} {r['ops']:6.0f} {r['host_reads']:10.1f} {whole:>27s} {pieces:>37s} "
              f"{r['images_per_s']:9d}  {r['reads_by_op']}")
    for name, r in rows.items():
        for reason in r["break_reasons"]:
            print(f"  {name}: {reason}")


if __name__ == "__main__":
    main()
