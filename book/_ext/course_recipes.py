"""The appendix "How the recipes were chosen" (book/recipes.md) and the optional page beside it (book/heads_study.md):
their tables, written when the book is built from the benchmarks' stored results, ``benchmarks/results/NAME.json``
(read from the checkout by ``tools.results.benchmark_result``: maintainer tooling; the package ships only what the
chapters read), so no number in a table is typed by hand.

    ```{recipe-table} ablate-mnist
    ```

renders the table of that name: ``TABLES`` maps each name to the result files it reads and a function turning them
into a header and rows of strings. Each file is a dependency of the page, so re-recording a benchmark and rebuilding
updates the table.
"""

from course_chapters import make_table
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from tools.results import BENCHMARKS, benchmark_result

logger = logging.getLogger(__name__)


def percent(fraction):
    return f"{100 * fraction:.2f}%"


def machine_name(machine):
    """A run's recorded machine: {'cpu': 'Intel(R) Xeon(R) Processor', 'amx': True} -> 'Intel Xeon, AMX'."""
    machine = machine or {}
    cpu = (machine.get("cpu") or "not recorded").replace("(R)", "").removesuffix(" Processor").strip()
    return cpu + (", AMX" if machine.get("amx") else "")


def threads_cell(run):
    """The threads a run trained on: '2'; '2, 1 at times' when the thread watch took a core away while another
    process held it; '2 from 87 s' when its only change set the count it ended with."""
    changes = run.get("thread_changes") or []
    seen = {run["threads"], *(threads for _, threads in changes)}
    if not changes:
        return str(run["threads"])
    return f"{max(seen)}, {min(seen)} at times" if len(seen) > 1 else f"{run['threads']} from {changes[0][0]:.0f} s"


def stem_cell(run, default):
    """The conv stem a run trained, '(16, 32, 64)' (', strided' without pooling): its recorded recipe with its
    changes, or for runs recorded before the recipe was stored, ``default`` with the changes."""
    model = {"stem_channels": default, **run.get("settings", {}).get("model", {})}
    model.update({key.removeprefix("model."): value for key, value in run["set"].items() if key.startswith("model.")})
    return str(tuple(model["stem_channels"])) + ("" if model.get("stem_pool", True) else ", strided")


def length_cell(run):
    """'2 epochs in 93 s' for a run fixed at a number of epochs (its budget only a cap), else '120 s budget'."""
    epochs = run["set"].get("train.epochs")
    return f"{epochs} epochs in {run['wall_seconds']:.0f} s" if epochs else f"{run['budget']:.0f} s budget"


def changes_cell(run):
    """The settings a run changed from the recipe of its day, besides its length, stem and precision."""
    shown = {key: value for key, value in run["set"].items()
             if key not in ("train.epochs", "train.amp") and not key.startswith("model.stem")}
    return ", ".join(f"{key}={value}" for key, value in shown.items()) or "none"


def on_validation(run):
    """A run recorded after the validation split: its choice is read from its validation accuracy."""
    return run.get("val_accuracy") is not None


def ablate_mnist(result):
    header = ["length", "seed", "stem", "other changes", "threads", "epochs", "test accuracy"]
    rows = [[length_cell(run), str(run["seed"]), stem_cell(run, [32, 64]), changes_cell(run), threads_cell(run),
             f"{run['epochs']:.2f}", percent(run["test_accuracy"])]
            for run in result["runs"] if not on_validation(run)]  # those: the next table
    return header, rows


def stem_mnist(result):
    """The stem chosen again on the validation split: the recipe in its whole budget, the stem alone changed."""
    header = ["stem", "seed", "machine", "length", "epochs", "validation accuracy", "test accuracy"]
    rows = [[stem_cell(run, None), str(run["seed"]), machine_name(run["machine"]), length_cell(run),
             f"{run['epochs']:.2f}", percent(run["val_accuracy"]), percent(run["test_accuracy"])]
            for run in result["runs"] if on_validation(run)]
    return header, rows


def crop_comparison(run):
    """A run of the crop comparison: the recipe in its half hour with nothing changed but, maybe, the crop."""
    return set(run["set"]) <= {"augment.padding"}


def ablate_cifar10(result):
    header = ["machine", "length", "stem", "precision", "other changes", "threads", "epochs", "test accuracy"]
    precision = {"off": "float32", "bf16": "bfloat16", None: "native"}
    rows = []
    for run in result["runs"]:
        if crop_comparison(run):  # its own table, below
            continue
        flips = run.get("settings", {}).get("train", {}).get("test_flips", False)  # the final evaluation's mirror
        rows.append([machine_name(run["machine"]), length_cell(run), stem_cell(run, [64, 128]),
                     precision[run["set"].get("train.amp")], changes_cell(run), threads_cell(run),
                     f"{run['epochs']:.2f}",
                     percent(run["test_accuracy"]) + (" with test-time flips" if flips else "")])
    return header, rows


def crop_cifar10(result):
    """The crop comparison's runs: the ones on validation first (the decision), then the earlier ones on test."""
    header = ["training images", "crop", "seed", "machine", "epochs", "validation accuracy", "test accuracy",
              "test, one view"]
    runs = [run for run in result["runs"] if crop_comparison(run)]
    runs.sort(key=lambda run: run.get("val_accuracy") is None)  # stable: each group keeps its recorded order
    rows = []
    for run in runs:
        padding = run["set"].get("augment.padding", run["settings"]["augment"]["padding"])
        held_out = run.get("val_accuracy") is not None  # recorded after the split: 5,000 images held out
        rows.append(["45,000" if held_out else "50,000", f"padding {padding}" if padding else "none",
                     str(run["seed"]), machine_name(run["machine"]), f"{run['epochs']:.2f}",
                     percent(run["val_accuracy"]) if held_out else "not held out",
                     percent(run["test_accuracy"]) + " with test-time flips",
                     percent(run["test_accuracy_one_view"])])
    return header, rows


def stem_speed(result):
    header = ["recipe", "stems timed", "batch", "ms per step", "speed-up (range)", "rounds", "machine"]
    rows = [[run["recipe"], " against ".join(str(tuple(stem)) for stem in run["stems"]), str(run["batch_size"]),
             f"{run['first_ms']:.1f} against {run['second_ms']:.1f}",
             f"{run['speedup']:.2f}x ({run['speedup_range'][0]:.2f} to {run['speedup_range'][1]:.2f}x)",
             str(run["rounds"]), machine_name(run["machine"])] for run in result["runs"]]
    return header, rows


def short_schedule(*results):
    header = ["recipe", "stem", "epochs at low resolution", "epochs at full size", "training seconds",
              "last weights", "weight EMA (decay: accuracy)"]
    rows = []
    for result in results:
        for run in result["runs"]:
            stem = run.get("settings", {}).get("model", {}).get("stem_channels")
            low = f"{run['low_epochs']:g} at {run['low_size']} px" if run["low_epochs"] else "0"
            emas = ", ".join(f"{decay}: {percent(ema['test_accuracy'])}" for decay, ema in run["ema"].items())
            rows.append([result["recipe"], str(tuple(stem)) if stem else "not recorded", low,
                         f"{run['high_epochs']:g}", f"{run['low_seconds'] + run['high_seconds']:.0f}",
                         percent(run["test_accuracy"]), emas])
    return header, rows


def flip_tta(result):
    header = ["checkpoint", "epochs", "one view", "with its mirror", "gain (points)", "machine"]
    rows = [[run["checkpoint"], f"{run['epochs']:.2f}", percent(run["test_accuracy"]), percent(run["flip_accuracy"]),
             f"{100 * run['gain']:+.2f}", machine_name(run["machine"])] for run in result["runs"]]
    return header, rows


def _model_cell(step):
    model = step.get("model")
    cell = f"stem {tuple(model['stem_channels'])}" if model else "stem not recorded"
    return cell + (f", batch {step['batch_size']}" if "batch_size" in step else "")


def bf16_speedup(result):
    header = ["machine", "recipe", "model timed", "float32 ms", "bfloat16 ms", "speed-up (range)", "rounds"]
    rows = [[machine_name(run["machine"]), step["recipe"], _model_cell(step), f"{step['fp32_ms']:.0f}",
             f"{step['bf16_ms']:.0f}",
             f"{step['speedup']:.2f}x ({step['speedup_range'][0]:.2f} to {step['speedup_range'][1]:.2f}x)",
             str(step["rounds"])] for run in result["runs"] for step in run["steps"]]
    return header, rows


def matmul(result):
    header = ["machine", "matrix product", "float32 GFLOP/s", "bfloat16 GFLOP/s"]
    rows = [[machine_name(run["machine"]), "512 x 512", f"{run['matmul_gflops']['fp32_512']:.0f}",
             f"{run['matmul_gflops']['bf16_512']:.0f}"] for run in result["runs"] if "matmul_gflops" in run]
    return header, rows


def compile_speedup(result):
    header = ["machine", "recipe", "compiling (s)", "eager ms", "compiled ms", "speed-up (range)", "rounds"]
    rows = [[machine_name(run["machine"]), step["recipe"], f"{step['compile_seconds']:.0f}",
             f"{step['eager_ms']:.0f}", f"{step['compiled_ms']:.0f}",
             f"{step['speedup']:.2f}x ({step['speedup_range'][0]:.2f} to {step['speedup_range'][1]:.2f}x)",
             str(step["rounds"])] for run in result["runs"] for step in run["steps"]]
    return header, rows


def plain_protocol_cost(result):
    header = ["protocol", "median ms a step", "x crop + flip", "alternated rounds", "machine"]
    machine = f"{machine_name(result['machine'])}, {result['machine'].get('vector_isa', 'ISA not recorded')}"
    rows = [[name, f"{ms:.0f}", f"{result['ratio_to_crop_flip'][name]:.2f}x", str(result["rounds"]), machine]
            for name, ms in result["median_ms"].items()]
    return header, rows


def plain_protocol_start(result):
    epochs = result["runs"][0]["epoch"]
    header = ["RandAugment, each op applied with", "code", *[f"epoch {e:g}" for e in epochs],
              f"train loss, epoch {epochs[-1]:g}"]
    rows = [[f"p = {run['settings']['augment'].get('rand_prob', 1.0):g}", run["code"],
             *[percent(a) for a in run["test_acc"]], f"{run['train_loss'][-1]:.3f}"] for run in result["runs"]]
    return header, rows


def plain_findings(result):
    header = ["run", "epoch", "test accuracy", "nearest position a neighbour (Spearman)",
              "most local head, layers 1-2", "layer means, first to last", "quarter deleted: rollout / random",
              "filter top-8 share (init)"]
    rows = [[run["recipe"], f"{run['epoch']:g}", percent(run["test_accuracy"]),
             f"{100 * run['neighbour_share']:.1f}% ({run['spearman']:.2f})", f"{run['min_ratio_layers_1_2']:.2f}x",
             f"{run['layer_means_ratio'][0]:.2f}x to {run['layer_means_ratio'][-1]:.2f}x",
             f"{percent(run['deleted_quarter']['rollout'])} / {percent(run['deleted_quarter']['random'])}",
             f"{run['filter_share']:.2f} ({run['filter_share_init']:.2f})"] for run in result["runs"]]
    return header, rows


def local_heads(ratios, line=0.8):
    """'2 2 1 0 0 0': per layer, how many heads look less far than ``line`` times uniform attention."""
    return " ".join(str(sum(r < line for r in layer)) for layer in ratios)


def heads_protocols(result, control="cifar10-plain-mixup"):
    """The optional page's first table: the basic protocol's model and the small-data run at each measured epoch."""
    header = ["run", "epoch", "test accuracy", "most local head, layers 1-2", "layer 1 mean",
              "local heads per layer (below 0.8x)"]
    rows = [[run["recipe"], f"{run['epoch']:g}", percent(run["test_accuracy"]), f"{run['min_ratio_layers_1_2']:.2f}x",
             f"{run['layer_means_ratio'][0]:.2f}x", local_heads(run["distance_ratio"])]
            for run in result["runs"] if run["recipe"] != control]
    return header, rows


def heads_cutmix(result, control="cifar10-plain-mixup"):
    """The optional page's CutMix control: the two runs at the epochs where both were measured."""
    runs = {(run["recipe"], run["epoch"]): run for run in result["runs"]}
    main = next(recipe for recipe, _ in runs if recipe.startswith("cifar10-plain-mix") and recipe != control)
    epochs = sorted(epoch for recipe, epoch in runs if recipe == control and (main, epoch) in runs)
    header = ["epoch", "test accuracy, with CutMix", "Mixup only", "most local head, with CutMix", "Mixup only",
              "the more local by"]
    rows = []
    for epoch in epochs:
        cut, mix = runs[(main, epoch)], runs[(control, epoch)]
        gap = mix["min_ratio_layers_1_2"] - cut["min_ratio_layers_1_2"]  # > 0: the run with CutMix is more local
        rows.append([f"{epoch:g}", percent(cut["test_accuracy"]), percent(mix["test_accuracy"]),
                     f"{cut['min_ratio_layers_1_2']:.2f}x", f"{mix['min_ratio_layers_1_2']:.2f}x",
                     f"{abs(gap):.2f}, {'with CutMix' if gap > 0 else 'Mixup only'}"])
    return header, rows


def heads_data(result):
    """The optional page's data table: chapter 07's ViT runs at each training-set size, one value per seed."""
    header = ["training images", "most local head, layers 1-2", "spread between seeds", "layer 1 mean",
              "test accuracy", "best epoch", "images seen by then"]
    rows = []
    for size in result["sizes"]:
        runs = sorted((r for r in result["runs"] if r["model"] == "vit" and r["images"] == size
                       and "distance_ratio" in r), key=lambda r: r["seed"])
        if not runs:
            continue
        local = [r["min_ratio_layers_1_2"] for r in runs]
        rows.append([f"{size:,}", ", ".join(f"{x:.2f}x" for x in local), f"{max(local) - min(local):.2f}",
                     ", ".join(f"{sum(r['distance_ratio'][0]) / len(r['distance_ratio'][0]):.2f}x" for r in runs),
                     ", ".join(percent(r["test_accuracy"]) for r in runs),
                     ", ".join(f"{r['best_epoch']:.0f}" for r in runs),
                     ", ".join(f"{r['best_epoch'] * size / 1e6:.2f}M" for r in runs)])
    return header, rows


def step_overhead(result):
    """Per training step of each recipe, the last recorded run of ``step_overhead.py``: the eager step's operations
    and host reads, the compiled whole step's graphs and breaks, the eager step's images a second."""
    run = result["runs"][-1]
    header = ["recipe", "operations (eager)", "host reads (eager)", "whole step: graphs, breaks",
              "images/s (eager, range)", "device, machine"]
    where = f"{run['device']}, {machine_name(run['machine'])}, torch {run['torch']}"
    rows = [[name, f"{r['ops']:,.0f}", f"{r['host_reads']:g}",
             f"{r['whole_step']['graphs']}, {r['whole_step']['breaks']}",
             f"{r['images_per_s']:,} ({r['images_per_s_range'][0]:,} to {r['images_per_s_range'][1]:,})", where]
            for name, r in run["recipes"].items()]
    return header, rows


def amp_trials(result):
    """The timed trial of `amp="native"` that shipped runs made (``bf16_trial`` in their metrics.json, kept in
    ``amp_trials.json`` once a run is re-shipped)."""
    header = ["shipped run", "machine", "float32 ms per step", "bfloat16 ms per step", "trained in"]
    rows = [[run["run"], machine_name(run["machine"]), f"{run['fp32_ms']:.1f}", f"{run['bf16_ms']:.1f}",
             "bfloat16" if run["bf16"] else "float32"] for run in result["runs"]]
    return header, rows


TABLES = {  # name -> (benchmarks/results files it reads, the function making the table from them), in page order
    "ablate-mnist": (["ablate_mnist"], ablate_mnist),
    "stem-speed": (["stem_speed"], stem_speed),
    "stem-mnist": (["ablate_mnist"], stem_mnist),
    "ablate-cifar10": (["ablate_cifar10"], ablate_cifar10),
    "crop-cifar10": (["ablate_cifar10"], crop_cifar10),
    "short-schedule": (["short_schedule_mnist", "short_schedule_cifar10"], short_schedule),
    "flip-tta": (["flip_tta"], flip_tta),
    "plain-protocol-cost": (["plain_protocol_cost"], plain_protocol_cost),
    "plain-protocol-start": (["plain_protocol_start"], plain_protocol_start),
    "plain-findings": (["plain_findings"], plain_findings),
    "bf16-speedup": (["train_throughput_bf16"], bf16_speedup),
    "matmul": (["train_throughput_bf16"], matmul),
    "amp-trials": (["amp_trials"], amp_trials),
    "compile-speedup": (["train_throughput_compile"], compile_speedup),
    "step-overhead": (["step_overhead"], step_overhead),
    # the optional page "What makes a head local?" (book/heads_study.md)
    "heads-protocols": (["plain_findings"], heads_protocols),
    "heads-cutmix": (["plain_findings"], heads_cutmix),
    "heads-data": (["data_scaling"], heads_data),
}
PAGES = {"recipes": list(TABLES)[:-3], "heads_study": list(TABLES)[-3:]}  # the page that shows each table, in order


def table(name):
    """(header, rows) of the appendix's table ``name``; KeyError for a name not in ``TABLES``."""
    files, build = TABLES[name]
    return build(*(benchmark_result(file) for file in files))


class RecipeTable(SphinxDirective):
    """`{recipe-table} NAME`: one of the appendix's tables, from the stored results (``TABLES``)."""

    required_arguments = 1

    def run(self):
        name = self.arguments[0]
        if name not in TABLES:
            logger.warning("recipe-table: no table %r (known: %s)", name, ", ".join(TABLES),
                           location=self.get_location())
            return []
        for file in TABLES[name][0]:
            self.env.note_dependency(str(BENCHMARKS / f"{file}.json"))
        header, rows = table(name)
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
        return [make_table(header, rows, widths=widths)]


def setup(app):
    app.add_directive("recipe-table", RecipeTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
