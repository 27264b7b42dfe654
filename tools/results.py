"""The README's tables, the book's results page and the measurements the chapters read (repository tooling, not
installed with the course): generated from each shipped run's ``vit_course/checkpoints/NAME/metrics.json``, from the
seed runs of ``benchmarks/targets.py`` (``benchmarks/results/targets.json``, one entry per variant), and, for the
chapters, copies of the lab's results they name (``measurement("NAME")`` in ``solutions/*.ipynb``) into the
package, ``vit_course/measurements/NAME.json``, so no number is typed twice and the course reads only itself.

    python -m tools.results            # rewrite the README's tables and the package's measurements
    python -m tools.results --check    # exit 1 if either is out of date
"""

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from vit_course.files import atomic_write, write_text
from vit_course.kernel import ROOT
from vit_course.results import MEASUREMENTS, accuracy_cell, one_view_accuracy, precision

CHECKPOINTS = ROOT / "vit_course" / "checkpoints"
BENCHMARKS = ROOT / "benchmarks" / "results"  # each benchmarks/NAME.py writes its NAME*.json there
SOLUTIONS = ROOT / "solutions"
RUNS = (("mnist", "MNIST"), ("cifar10", "CIFAR-10"), ("cifar10-plain", "CIFAR-10, paper-style ViT"),
        ("cifar10-plain-basic", "CIFAR-10, paper-style ViT, basic protocol"))
BOOK_HEADER = ["Run", "Test accuracy", "Training time", "Epochs", "Parameters", "Device", "Precision", "Reproduce with"]
README_HEADER = ["run", "command", "test accuracy", "epochs done", "training time", "parameters", "precision",
                 "machine"]
BEGIN, END = "<!-- results: written by `python -m tools.results` -->", "<!-- end of results -->"
SEEDS_HEADER = ["recipe", "precision", "target", "seeds", "test accuracy, mean ± std (min to max)", "slowest run",
                "epochs", "machine"]
SEEDS_BEGIN, SEEDS_END = "<!-- seeds: written by `python -m tools.results` -->", "<!-- end of seeds -->"


def format_seconds(seconds):
    """412.3 -> '6 min 52 s'; under a minute, '48 s'; from an hour, '1 h 2 min'."""
    seconds = round(float(seconds))
    if seconds < 0:
        raise ValueError(f"training time must be >= 0, got {seconds} s")
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def format_count(n):
    """5_400_000 -> '5.4 M', 210_000 -> '210 k', 950 -> '950'."""
    n = int(n)
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.0f} k" if n >= 1000 else str(n)


def read_metrics(path):
    """The validated contents of one metrics.json. Raises ValueError naming the file and the bad value."""
    metrics = json.loads(Path(path).read_text())
    if not isinstance(metrics, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(metrics).__name__}")
    acc = metrics.get("test_accuracy")
    if not isinstance(acc, (int, float)) or not 0 <= acc <= 1 or math.isnan(acc):
        raise ValueError(f"{path}: test_accuracy must be a number in 0..1, got {acc!r}")
    seconds = metrics.get("train_seconds")
    if not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"{path}: train_seconds must be a number >= 0, got {seconds!r}")
    return metrics


def shipped(checkpoints=CHECKPOINTS):
    """[(run, label, metrics or None)] for every run in ``RUNS``; None where it has not shipped yet."""
    out = []
    for run, label in RUNS:
        path = Path(checkpoints) / run / "metrics.json"
        out.append((run, label, read_metrics(path) if path.is_file() else None))
    return out


def book_rows(checkpoints=CHECKPOINTS):
    """One row of strings per run for the book's results page (``BOOK_HEADER`` gives the columns)."""
    rows = []
    for run, label, m in shipped(checkpoints):
        command = f"python -m vit_course train {run}"
        if m is None:
            rows.append([label, "not yet trained", "—", "—", "—", "—", "—", command])
            continue
        rows.append([label, accuracy_cell(m, lambda fraction: f"{100 * fraction:.2f} %"),
                     format_seconds(m["train_seconds"]),
                     epochs_cell(m) if "epochs" in m else "—", format_count(m["params"]) if "params" in m else "—",
                     str(m.get("device", "—")), precision(m), m.get("command") or command])
    return rows


def readme_table(checkpoints=CHECKPOINTS):
    """The README's table (markdown lines) of the runs that have shipped, with the machine each ran on."""
    lines = ["| " + " | ".join(README_HEADER) + " |", "|" + "---|" * len(README_HEADER)]
    for run, label, m in shipped(checkpoints):
        if m is None:
            continue
        where = _where(m.get("machine"))
        cells = [label, f"`python -m vit_course train {run}`", accuracy_cell(m),
                 epochs_cell(m), f"{m['train_seconds']:.0f} s", f"{m['params']:,}", precision(m),
                 f"{where}; {m.get('threads', '?')} threads, load {_number(m.get('cpu_load_before'))}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines








def epochs_cell(metrics):
    """'12.34 of 64' for a run with a planned number of epochs; '12.34 (as many as the budget held)' otherwise."""
    planned = metrics.get("planned_epochs")
    return f"{metrics['epochs']:.2f} " + (f"of {planned}" if planned else "(as many as the budget held)")


def seed_rows(results=BENCHMARKS):
    """One row of strings per variant in ``benchmarks/results/targets.json`` (the seeds of one recipe;
    ``SEEDS_HEADER``); no file, no rows.

    A variant named after its recipe holds the recipe as it stands; any other name, seeds of an earlier version of
    the recipe or of the current one on another machine, kept for comparison (its ``description`` says which): its
    row says 'RECIPE, NAME' and comes after the recipe's own. A single seed has no spread to show, so its row gives
    only its accuracy.
    """
    rows = []
    for r in _variants(results):
        runs, target = r["runs"], r["target"]
        spread = len(runs) > 1  # a single seed has none: its accuracy and epochs alone
        epochs = sorted(run["epochs"] for run in runs)
        kinds = ", ".join(sorted({precision(run) for run in runs}))
        variant = r["name"] if r["name"] != r["recipe"] else None
        one_view = [one_view_accuracy(run) for run in runs]
        flips = one_view != [run["test_accuracy"] for run in runs]  # the final evaluation averaged mirror images
        accuracy = (f"{r['mean_accuracy']:.2%} ± {r['std_accuracy']:.2%} ({r['min_accuracy']:.2%} to "
                    f"{r['max_accuracy']:.2%})" if spread else f"{r['mean_accuracy']:.2%} (one seed)")
        if flips:
            accuracy += (f" with test-time flips; one view {statistics.mean(one_view):.2%}"
                         + (f" ± {statistics.stdev(one_view):.2%}" if spread else ""))
        rows.append([f"{r['recipe']}, {variant}" if variant else r["recipe"], kinds,
                     f"{target['test_accuracy']:.1%} in {target['wall_seconds']} s", str(len(runs)), accuracy,
                     f"{r['max_wall_seconds']:.0f} s",
                     f"{epochs[0]:.2f} to {epochs[-1]:.2f}" if spread else f"{epochs[0]:.2f}",
                     _where(runs[0].get("machine"))])
    return rows


def _variants(results=BENCHMARKS):
    """The variants of ``targets.json`` in the seeds table's order: by recipe, the recipe as it stands first."""
    path = Path(results) / "targets.json"
    variants = json.loads(path.read_text())["variants"] if path.is_file() else []
    return sorted(variants, key=lambda v: (v["recipe"], v["name"] != v["recipe"], v["name"]))


def variant_notes(results=BENCHMARKS):
    """[(row label, description)] of the seeds table's rows that are not a recipe as it stands (``seed_rows``)."""
    return [(f"{v['recipe']}, {v['name']}", v["description"]) for v in _variants(results) if v["name"] != v["recipe"]]


def seeds_table(results=BENCHMARKS):
    """The README's table of seed runs (markdown lines), or a line saying there are none yet."""
    rows = seed_rows(results)
    if not rows:
        return ["No seed runs recorded yet: `python benchmarks/targets.py NAME --runs 3 --record` records them."]
    return ["| " + " | ".join(SEEDS_HEADER) + " |", "|" + "---|" * len(SEEDS_HEADER)] + [
        "| " + " | ".join(row) + " |" for row in rows]




GPU_HEADER = ["step", "ok", "seconds", "what it did"]
GPU_STEPS = ([("notebook", f"{n:02d}") for n in range(1, 10)]  # the steps of a full run of benchmarks/gpu_check.py
             + [("recipe", name) for name in ("mnist", "cifar10", "cifar10-gpu", "cifar10-fast")]
             + [("precision", "float16+scaler"), ("precision", "bfloat16"), ("parity", "timm")]
             + [("stability", "mean-pooled ViT")])


def gpu_check(results=BENCHMARKS):
    """The GPU check's record (``benchmarks/gpu_check.py``): (one line on where and how it ran, a row of strings per
    step, ``GPU_HEADER``); (None, []) before one is committed."""
    path = Path(results) / "gpu_check.json"
    if not path.is_file():
        return None, []
    record = json.loads(path.read_text())
    data = record["data"]
    where = (f"{record['device']}, PyTorch {record['torch']}, {format_seconds(record['seconds'])} in all"
             f"{' (smoke run)' if record['smoke'] else ''}; CIFAR-10: {data['cifar10']}"
             + (f" ({data['note']})" if data.get("note") and data["note"] not in record.get("command", "") else ""))
    missing = sorted(set(GPU_STEPS) - {(s["kind"], s["name"]) for s in record["steps"]})
    if missing:
        where += "; a partial run, without " + ", ".join(f"{kind} {name}" for kind, name in missing)
    where += f" ({record['command']}, commit {record['commit']})" if record.get("command") else ""
    rows = [[f"{s['kind']} {s['name']}", "yes" if s["ok"] else "no", f"{s['seconds']:.0f}", _gpu_result(s)]
            for s in record["steps"]]
    return where, rows


def _gpu_result(step):
    if not step["ok"]:  # the error's last line: the exception (a notebook's traceback may be coloured)
        lines = re.sub(r"\x1b\[[0-9;]*m", "", step.get("error", "")).strip().splitlines()
        return "failed: " + (lines[-1] if lines else "no error recorded")
    if step["kind"] == "recipe":
        return (f"{step['accuracy']:.2%} test accuracy after {step['epochs']:.2f} of {step['planned_epochs']} "
                f"epochs ({step['precision']})" + (": cut by the check's time budget" if step["shortened"] else ""))
    if step["kind"] == "precision":
        scale = f", loss scale {step['loss_scale']:.0f}" if "loss_scale" in step else ""
        return f"loss {step['loss'][0]:.4f} -> {step['loss'][1]:.4f} over 20 steps ({step['dtype']}{scale})"
    return step.get("pytest") or "ran top to bottom, on the GPU"


def _where(machine):
    """A run's recorded machine as 'AMD EPYC, AVX512' ('..., AVX512, AMX' with matrix tiles), or 'not recorded'."""
    machine = machine or {}
    amx = "AMX" if machine.get("amx") else None
    return ", ".join(str(v) for v in (machine.get("cpu"), machine.get("vector_isa"), amx) if v) or "not recorded"


def _number(value):
    return f"{value:.1f}" if isinstance(value, (int, float)) else "?"


def _replace_block(text, begin, end, lines):
    if begin not in text or end not in text:
        raise ValueError(f"the README has no {begin!r} ... {end!r} block for a generated table")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1]


def readme_with_table(text, checkpoints=CHECKPOINTS, results=BENCHMARKS):
    """``text`` (the README) with its generated blocks rewritten: ``readme_table`` and ``seeds_table``."""
    text = _replace_block(text, BEGIN, END, readme_table(checkpoints))
    return _replace_block(text, SEEDS_BEGIN, SEEDS_END, seeds_table(results))


def benchmark_result(name, results=BENCHMARKS):
    """The lab's stored result ``benchmarks/results/NAME.json`` (the book's appendix and these tables read them from
    the checkout; a chapter reads the package's copy, ``vit_course.results.measurement``). -> the parsed JSON."""
    path = Path(results) / f"{name}.json"
    if not path.is_file():
        scripts = sorted(BENCHMARKS.parent.glob("*.py"), key=lambda p: -len(p.stem))  # NAME_bf16: NAME.py's
        script = next((p.stem for p in scripts if name.startswith(p.stem)), name)
        raise FileNotFoundError(f"no {name}.json in {results}: `python benchmarks/{script}.py` writes it "
                                f"(benchmarks/README.md)")
    return json.loads(path.read_text())


def chapter_measurements(solutions=SOLUTIONS):
    """The names of the results the chapters read, ``measurement("NAME")`` in ``solutions/*.ipynb``, sorted."""
    pattern = re.compile(r"""\bmeasurement\(\s*\\?["'](\w+)\\?["']""")
    return sorted({name for path in Path(solutions).glob("*.ipynb") for name in pattern.findall(path.read_text())})


def stale_measurements(results=BENCHMARKS, package=MEASUREMENTS, solutions=SOLUTIONS):
    """What differs between the package's measurements and the lab's results the chapters read: file names missing,
    different or left over in ``package`` (empty when up to date)."""
    wanted = {f"{name}.json" for name in chapter_measurements(solutions)}
    have = {path.name for path in Path(package).glob("*.json")}
    differ = [name for name in sorted(wanted) if name not in have
              or (Path(package) / name).read_bytes() != (Path(results) / name).read_bytes()]
    return differ + sorted(have - wanted)


def copy_measurements(results=BENCHMARKS, package=MEASUREMENTS, solutions=SOLUTIONS):
    """Make ``package`` hold exactly the lab's results the chapters read, byte for byte. -> the names changed."""
    changed = stale_measurements(results, package, solutions)
    wanted = {f"{name}.json" for name in chapter_measurements(solutions)}
    for name in changed:
        if name in wanted:
            benchmark_result(Path(name).stem, results)  # a missing result names the script that writes it
            data = (Path(results) / name).read_bytes()
            atomic_write(Path(package) / name, lambda f, data=data: f.write(data))
        else:
            (Path(package) / name).unlink()
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.results", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the README's tables or the package's measurements are out of date")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new = readme_with_table(text)
    if args.check:
        stale = stale_measurements()
        if new != text:
            print(f"{args.readme}: the results table is out of date: run `python -m tools.results`",
                  file=sys.stderr)
        if stale:
            print(f"{MEASUREMENTS}: {', '.join(stale)} differ from benchmarks/results or the chapters' "
                  f"measurement(...) calls: run `python -m tools.results`", file=sys.stderr)
        return int(new != text or bool(stale))
    if new != text:
        write_text(args.readme, new)
        print(f"wrote the results table of {args.readme}")
    for name in copy_measurements():
        print(f"updated {MEASUREMENTS.relative_to(ROOT) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
