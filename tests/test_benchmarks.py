"""The paper-experiment benchmarks run end to end on a sliver of the data (--smoke) and write what the chapters
read."""

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

import vit_course.results
from tools import results
from vit_course import ViT, recipes, save_checkpoint, sincos_position_embedding
from vit_course.batches import loaders
from vit_course.checkpoint import load_checkpoint, pretrained_path
from vit_course.recipes import RECIPES
from vit_course.results import measurement

from .markers import needs_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from course_recipes import heads_data  # noqa: E402  (the optional page's table of chapter 07's runs)

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def benchmark(name):
    """benchmarks/NAME.py as a module, imported as ``python benchmarks/NAME.py`` would: its folder on the path, so
    that its ``import common`` finds the scripts' shared helper."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_by_the_chapters(result, monkeypatch):
    """Run the code cells of chapter 07 that read data_scaling.json, and the table of the optional page on heads
    (book/heads_study.md, formerly chapter 08's section 11), on RESULT instead of the stored file."""
    monkeypatch.setattr(vit_course.results, "measurement", lambda name: result)
    header, rows = heads_data(result)
    assert rows and all(len(row) == len(header) for row in rows)
    for notebook in ("07_train_cifar10",):
        cells = json.loads((ROOT / "solutions" / f"{notebook}.ipynb").read_text())["cells"]
        sources = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
        readers = [source for source in sources if 'measurement("data_scaling")' in source]
        assert readers, f"{notebook} no longer reads data_scaling.json: update this test"
        for source in readers:
            exec(source, {"measurement": vit_course.results.measurement, "plt": plt})
        plt.close("all")


@needs_data
def test_data_scaling_writes_the_chapters_json_and_resumes(tmp_path, monkeypatch):
    out, work = tmp_path / "scaling.json", tmp_path / "work"
    script = benchmark("data_scaling")
    script.main(["--smoke", "--seeds", "0", "--models", "vit", "cnn", "--out", str(out), "--work", str(work)])
    result = json.loads(out.read_text())
    assert result["validation_images"] == 5000 and result["seeds"] == [0] and result["sizes"] == [256, 512]
    assert [(r["model"], r["images"]) for r in result["runs"]] == [("vit", 256), ("cnn", 256), ("vit", 512),
                                                                   ("cnn", 512)]  # small sets first
    fields = {"model", "seed", "images", "epochs", "best_epoch", "steps", "val_accuracy", "test_accuracy",
              "seconds", "params"}
    for run in result["runs"]:
        assert fields <= set(run) and 0 <= run["test_accuracy"] <= 1 and run["params"] > 0
        assert len(run["machines"]) == 1 and run["machines"][0]["cores"] >= 1  # trained in one go, on this machine
        assert run["best_round"] <= run["rounds"] <= 3
        assert run["val_history"][run["best_round"] - 1] == run["val_accuracy"]
    assert not list(work.glob("*.pt"))  # a finished run leaves no work file
    for run in result["runs"]:  # the ViT's attention distances (chapter 08), layers x heads, shares of uniform's
        ratios = run.get("distance_ratio")
        assert (ratios is None) == (run["model"] != "vit")
        assert ratios is None or (len(ratios) == 6 and {len(row) for row in ratios} == {4}
                                  and run["min_ratio_layers_1_2"] == min(ratios[0] + ratios[1]) > 0)
    read_by_the_chapters(result, monkeypatch)  # what the chapters print and draw works on what the script writes
    stale = {**result, "runs": [{k: v for k, v in r.items() if k != "distance_ratio"} for r in result["runs"]]}
    out.write_text(json.dumps(stale))  # ViT runs from before the distances were recorded: trained again
    script.main(["--smoke", "--seeds", "0", "--models", "vit", "cnn", "--out", str(out), "--work", str(work)])
    redone = json.loads(out.read_text())["runs"]  # trained again, and in the same order
    assert [(r["model"], r["images"]) for r in redone] == [(r["model"], r["images"]) for r in result["runs"]]
    assert redone[1::2] == result["runs"][1::2] and all("distance_ratio" in r for r in redone[::2])
    out.write_text(json.dumps(result))
    script.main(["--smoke", "--seeds", "0", "1", "--models", "vit", "--sizes", "256", "--out", str(out),
                 "--work", str(work)])  # finished runs are skipped, a new seed appended
    again = json.loads(out.read_text())
    assert again["runs"][:4] == result["runs"] and [(r["model"], r["seed"]) for r in again["runs"][4:]] == [("vit", 1)]
    with pytest.raises(ValueError, match="other settings"):
        script.main(["--smoke", "--width", "32", "--out", str(out), "--work", str(work)])


@pytest.mark.parametrize("config", [dict(patch_size=4, pool="cls"),
                                    dict(patch_size=1, pool="mean", stem_channels=(8,))])
def test_distance_ratios_are_one_for_uniform_attention(config):
    """Heads whose queries and keys are zero attend uniformly: every share of uniform attention's distance is 1, in
    the stem's pixels too (a token of the hybrid covers 1 pixel of its map, 2 x 2 of the image)."""
    model = ViT(image_size=32, in_channels=3, num_classes=10, dim=16, depth=2, num_heads=2, **config)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.zero_()
            block.attn.qkv.bias.zero_()
    ratios = benchmark("common").distance_ratios(model, torch.randn(4, 3, 32, 32))
    torch.testing.assert_close(ratios, torch.ones(2, 2))


def test_data_scaling_plan_times_every_model():
    per_step = benchmark("data_scaling").plan(width=16, rounds=2)
    assert set(per_step) == {"vit", "hybrid", "cnn"} and min(per_step.values()) > 0


def test_data_scaling_early_stopping_decays_once_then_stops(tmp_path):
    """A validation accuracy that never improves after round 1: decay after `patience` rounds, stop after as many
    more; the best round's weights are kept."""
    script = benchmark("data_scaling")
    model = torch.nn.Linear(3, 2)
    scores = iter([0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4])
    script.evaluate = lambda model, batches: (0.0, next(scores))
    train = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]
    train = type("Loader", (list,), {"set_epoch": lambda self, epoch: None})(train)
    state = script.train_run(model, train, None, patience=2, max_rounds=20, work=tmp_path / "run.pt")
    assert state["best_round"] == 1 and state["decayed_at"] == 3 and state["rounds"] == 5


@needs_data
def test_finetune_resolution_writes_the_chapters_json(tmp_path):
    out = tmp_path / "ft.json"
    benchmark("finetune_resolution").main(["--smoke", "--seeds", "0", "--out", str(out), "--work", str(tmp_path)])
    result = json.loads(out.read_text())
    assert result["low_resolution"] == 16 and result["resolution"] == 32 and result["seeds"] == [0]
    (run,) = result["runs"]
    assert set(run["accuracy"]) == {"low", "resampled", "finetuned", "continued_low"}
    assert set(run["seconds"]) == {"pretrain", "finetune", "continued_low"} and min(run["seconds"].values()) > 0
    assert run["seconds"]["continued_low"] <= 1.5 * run["seconds"]["finetune"] + 1  # the same time, at 16 px
    assert result["reference"]["name"] == "cifar10-plain-basic" and 0 < result["reference"]["accuracy"] < 1
    assert set(result["step_seconds"]) == {"16", "32"}
    with pytest.raises(ValueError, match="plain ViT recipe"):
        benchmark("finetune_resolution").main(["--smoke", "--recipe", "cifar10", "--out", str(tmp_path / "x.json")])


def test_a_model_at_a_higher_resolution_keeps_its_weights_and_resamples_positions():
    torch.manual_seed(0)
    model = ViT(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=32, depth=1, num_heads=2).eval()
    bigger = benchmark("finetune_resolution").at_resolution(model, 48)
    assert bigger.grid_size == (12, 12) and bigger.pos_embed.shape == (1, 145, 32)
    assert torch.equal(bigger.pos_embed[0, 0], model.pos_embed[0, 0])  # the class token's row is kept
    assert torch.equal(bigger.patch_embed.proj.weight, model.patch_embed.proj.weight)


def test_the_lab_describes_the_machine_and_the_tables_show_amx(monkeypatch):
    """What the CPU is, for the records beside a measurement, is the lab's (benchmarks/machine.py)."""
    machine = benchmark("machine")
    for flags, amx in (({"avx512f", "avx512_bf16"}, False), ({"avx512f", "avx512_bf16", "amx_bf16"}, True)):
        monkeypatch.setattr(machine, "cpu_info", lambda flags=flags: ("Xeon", flags))
        record = machine.machine()
        assert record["amx"] is amx and record["bf16"] is True
        assert results._where(record).endswith(", AMX") is amx, results._where(record)
    monkeypatch.setattr(machine, "cpu_info", lambda: (None, None))  # no /proc/cpuinfo: unknown
    assert set(machine.machine()) == {"cpu", "vector_isa", "bf16", "amx", "cores"}
    assert machine.machine()["amx"] is None and machine.machine()["bf16"] is None
    assert not hasattr(vit_course.device, "machine") and not hasattr(vit_course.device, "cpu_flags")


def fake_run(name, seed, out):  # what targets.run_once returns, without training
    return {"seed": seed, "test_accuracy": [0.991, 0.995, 0.993][seed], "wall_seconds": 290.0 + seed,
            "epochs": 4.5 + seed, "threads": 2, "thread_changes": [], "load_before": 0.1,
            "machine": {"cpu": "Some CPU", "vector_isa": "avx512"}}


def test_targets_adds_the_machine_and_the_load_to_the_run_and_to_its_metrics(tmp_path, monkeypatch):
    """The course's metrics.json says nothing of the machine; targets.py, which runs the command, records where it
    ran and how busy it was, in its record and in the run's metrics.json (should that run ship)."""
    targets = benchmark("targets")
    metrics = {"test_accuracy": 0.99, "epochs": 4.5, "precision": "fp32", "threads": 2}

    def fake_command(argv, check):  # `python -m vit_course train ...` without training
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "metrics.json").write_text(json.dumps(metrics))

    monkeypatch.setattr(targets, "wait_for_quiet", lambda: 0.0)
    monkeypatch.setattr(targets.subprocess, "run", fake_command)
    run = targets.run_once("mnist", 0, tmp_path / "run")
    assert run["machine"]["cores"] > 0 and run["threads"] == 2 and run["test_accuracy"] == 0.99
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["machine"] == run["machine"] and set(metrics) < set(written)
    assert {"cpu_load_before", "cpu_load_after"} < set(written) and run["load_before"] == written["cpu_load_before"]


def test_targets_records_every_seed_and_the_readme_table_comes_from_the_file(tmp_path):

    targets, path = benchmark("targets"), tmp_path / "targets.json"
    targets.main(["mnist", "--runs", "3", "--results", str(tmp_path)], run=fake_run)
    assert not path.exists()  # without --record nothing is stored
    summary = targets.main(["mnist", "--runs", "3", "--record", "--results", str(tmp_path)], run=fake_run)
    (stored,) = json.loads(path.read_text())["variants"]
    assert stored == {"recipe": "mnist", "name": "mnist", "description": "the recipe as it stands",
                      **json.loads(json.dumps(summary))} and [r["seed"] for r in stored["runs"]] == [0, 1, 2]
    assert stored["mean_accuracy"] == pytest.approx(0.993) and stored["std_accuracy"] == pytest.approx(0.002)
    assert stored["target"] == {"test_accuracy": 0.993, "wall_seconds": 300} and stored["max_wall_seconds"] == 292.0
    again = targets.main(["mnist", "--seeds", "2", "--append", "--record", "--results", str(tmp_path)],
                         run=lambda name, seed, out: {**fake_run(name, seed, out), "test_accuracy": 0.99})
    assert [r["seed"] for r in again["runs"]] == [0, 1, 2] and again["max_accuracy"] == pytest.approx(0.995)
    assert again["runs"][2]["test_accuracy"] == 0.99 and again["runs"][:2] == stored["runs"][:2]
    targets.main(["mnist", "--runs", "3", "--record", "--results", str(tmp_path)], run=fake_run)  # as before
    (row,) = results.seed_rows(tmp_path)
    assert row == ["mnist", "float32", "99.3% in 300 s", "3", "99.30% ± 0.20% (99.10% to 99.50%)", "292 s",
                   "4.50 to 6.50", "Some CPU, avx512"]  # runs recorded without a precision trained in float32
    assert results.precision({"precision": "bf16"}) == "bf16 autocast"
    table = "\n".join(results.seeds_table(tmp_path))
    assert "| mnist | float32 | 99.3% in 300 s | 3 |" in table
    assert "No seed runs" in results.seeds_table(tmp_path / "empty")[0]


def test_a_variant_of_a_recipe_is_stored_under_its_name_with_its_description(tmp_path):

    targets, path = benchmark("targets"), tmp_path / "targets.json"
    with pytest.raises(SystemExit):  # a new variant must say what it is
        targets.main(["mnist", "--seeds", "1", "--variant", "wider", "--record", "--results", str(tmp_path)],
                     run=fake_run)
    with pytest.raises(SystemExit):  # nothing stored to add seeds to
        targets.main(["mnist", "--seeds", "1", "--append", "--record", "--results", str(tmp_path)], run=fake_run)
    targets.main(["mnist", "--seeds", "1", "--variant", "wider", "--description", "dim 96", "--record",
                  "--results", str(tmp_path)], run=fake_run)
    targets.main(["mnist", "--runs", "2", "--record", "--results", str(tmp_path)], run=fake_run)
    targets.main(["mnist", "--seeds", "0", "--variant", "wider", "--append", "--record", "--results", str(tmp_path)],
                 run=fake_run)  # the description stays
    variants = json.loads(path.read_text())["variants"]
    assert [(v["name"], v["description"], len(v["runs"])) for v in variants] == [
        ("mnist", "the recipe as it stands", 2), ("wider", "dim 96", 2)]  # the recipe first, then its variants
    assert [row[0] for row in results.seed_rows(tmp_path)] == ["mnist", "mnist, wider"]
    one = tmp_path / "one"
    targets.main(["mnist", "--seeds", "1", "--record", "--results", str(one)], run=fake_run)
    (row,) = results.seed_rows(one)  # one seed has no spread: its accuracy and epochs alone
    assert row[3:7] == ["1", "99.50% (one seed)", "291 s", "5.50"]
    flipped = targets.main(  # a recipe whose final evaluation averaged mirror images says so
        ["cifar10", "--runs", "2", "--record", "--results", str(tmp_path / "flips")],
        run=lambda name, seed, out: {**fake_run(name, seed, out), "test_accuracy": [0.81, 0.82][seed],
                                     "test_accuracy_one_view": [0.80, 0.81][seed]})
    assert flipped["mean_accuracy"] == pytest.approx(0.815)
    (row,) = results.seed_rows(tmp_path / "flips")
    assert row[4] == "81.50% ± 0.71% (81.00% to 82.00%) with test-time flips; one view 80.50% ± 0.71%"


def test_every_stored_variant_names_its_recipe_and_says_what_it_is():

    variants = results.benchmark_result("targets")["variants"]
    assert len({(v["recipe"], v["name"]) for v in variants}) == len(variants)
    for v in variants:
        assert v["recipe"] in RECIPES and v["description"].strip() and "\n" not in v["description"], v["name"]
    assert {v["recipe"] for v in variants if v["name"] == v["recipe"]} == {"mnist", "cifar10"}


@pytest.mark.parametrize("name", ["data_scaling", "finetune_resolution"])
def test_the_chapters_read_the_committed_result_of_each_paper_experiment(name):
    """Chapters 07 and 09 read these files through results.measurement (the package's copy of the lab's result):
    they exist, equal the lab's and come from the script."""
    result = measurement(name)
    assert result == json.loads((BENCHMARKS / "results" / f"{name}.json").read_text())
    assert result["machine"]["cores"] >= 1  # written by the script, which records where it ran


def test_the_package_holds_exactly_the_measurements_the_chapters_read_and_the_check_sees_a_stale_one(tmp_path):
    """vit_course/measurements/ holds a copy of each lab result a chapter's measurement("NAME") reads, byte for byte
    (`python -m tools.results --check`, which make test runs through tests/test_readme.py); a changed result, a
    missing copy or a copy no chapter reads is stale, and copying mends all three."""
    names = results.chapter_measurements()
    assert {"data_scaling", "finetune_resolution"} <= set(names)  # chapters 07 and 09
    assert results.stale_measurements() == [], "run `python -m tools.results`"
    lab, package = tmp_path / "lab", tmp_path / "package"
    lab.mkdir()
    for name in names:
        (lab / f"{name}.json").write_bytes((BENCHMARKS / "results" / f"{name}.json").read_bytes())
    assert results.copy_measurements(lab, package) == [f"{name}.json" for name in names]
    assert results.stale_measurements(lab, package) == []
    (lab / "data_scaling.json").write_text('{"runs": []}\n')  # re-recorded in the lab
    (package / "finetune_resolution.json").unlink()
    (package / "old.json").write_text("{}")
    stale = ["data_scaling.json", "finetune_resolution.json", "old.json"]
    assert results.stale_measurements(lab, package) == stale
    assert results.copy_measurements(lab, package) == stale and results.stale_measurements(lab, package) == []
    assert json.loads((package / "data_scaling.json").read_text()) == {"runs": []}
    assert not (package / "old.json").exists()


def test_the_committed_data_scaling_runs_cover_what_chapter_07_reads():
    """Issue 36's design: 5,000 validation images, >= 5 sizes from <= 5,000 to >= 45,000, three models, >= 2 seeds
    for every (model, size), and most runs early-stopped rather than cut off."""
    result = measurement("data_scaling")
    runs = result["runs"]
    sizes = sorted({run["images"] for run in runs})
    assert result["validation_images"] == 5000 and len(sizes) >= 5 and sizes[0] <= 5000 and sizes[-1] >= 45000
    seeds = {(model, size): {run["seed"] for run in runs if (run["model"], run["images"]) == (model, size)}
             for model in ("vit", "hybrid", "cnn") for size in sizes}
    assert all(len(s) >= 2 for s in seeds.values()), {key: s for key, s in seeds.items() if len(s) < 2}
    assert sum(run["epochs"] > run["best_epoch"] for run in runs) >= 0.75 * len(runs)


def test_the_committed_resolution_runs_have_every_accuracy_time_and_the_reference():
    result = measurement("finetune_resolution")
    assert (result["low_resolution"], result["resolution"]) == (16, 32) and len(result["seeds"]) >= 2
    for run in result["runs"]:
        assert set(run["accuracy"]) == {"low", "resampled", "finetuned", "continued_low"}
        assert set(run["seconds"]) == {"pretrain", "finetune", "continued_low"}
    assert {"name", "accuracy", "seconds"} <= set(result["reference"])


@needs_data
def test_gpu_check_smoke_runs_every_kind_of_step_and_records_it(tmp_path):
    """The GPU check's own smoke run, cut to one notebook (nbval runs all nine): every kind of step runs on this
    machine's device and lands in the record the results page reads."""
    import subprocess

    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke", "--notebooks", "01", "--out",
                           str(out), "--data", "CI"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["smoke"] is True and record["device"] == torch.device(vit_course.pick_device()).type
    assert record["data"] == {"note": "CI", "cifar10": "the course's copy", "cifar10_mean_abs_difference": 0.0}
    steps = {(s["kind"], s["name"]): s for s in record["steps"]}
    assert set(steps) == {("notebook", "01"), ("recipe", "mnist"), ("recipe", "cifar10"), ("recipe", "cifar10-gpu"),
                          ("recipe", "cifar10-fast"), ("precision", "float16+scaler"), ("precision", "bfloat16"),
                          ("parity", "timm"), ("stability", "mean-pooled ViT")}
    assert all(s["ok"] for s in steps.values()), [s for s in steps.values() if not s["ok"]]
    assert steps[("recipe", "mnist")]["epochs"] == 1 and 0 <= steps[("recipe", "mnist")]["accuracy"] <= 1
    assert steps[("precision", "float16+scaler")]["loss_scale"] > 0
    where, rows = results.gpu_check(tmp_path)
    assert "(smoke run)" in where and len(rows) == len(steps) and all(row[1] == "yes" for row in rows)


def test_a_gpu_check_step_that_fails_is_recorded_and_the_check_goes_on():
    gpu_check = benchmark("gpu_check")
    failed = gpu_check.step("recipe", "mnist", lambda: 1 / 0)
    assert not failed["ok"] and "ZeroDivisionError" in failed["error"] and failed["seconds"] >= 0
    assert gpu_check.step("parity", "timm", lambda: {"pytest": "15 passed"})["ok"]
    full = ({("notebook", p.name[:2]) for p in gpu_check.NOTEBOOKS} | {("recipe", r) for r in gpu_check.CHECK_RECIPES}
            | {("precision", p) for p in gpu_check.PRECISIONS}
            | {("parity", "timm"), ("stability", "mean-pooled ViT")})
    assert full == set(results.GPU_STEPS), "the results page's list of a full run's steps and gpu_check's differ"


def test_a_gpu_check_notebook_that_fails_names_its_cell_and_exception(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    path = tmp_path / "01_broken.ipynb"
    cells = [nbformat.v4.new_markdown_cell("# a chapter"), nbformat.v4.new_code_cell('print("Using device: cpu")'),
             nbformat.v4.new_code_cell("1 / 0")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    with pytest.raises(RuntimeError, match=r"^cell 2: ZeroDivisionError: division by zero$"):
        benchmark("gpu_check").notebook(path, torch.device("cpu"))()


@needs_data
def test_race_stability_reports_the_step_where_a_run_diverged_and_what_a_finite_run_reached():
    race_stability = benchmark("race_stability")
    diverged = race_stability.one_run("cnn", 1e3, "off", 0, seconds=5)  # a rate no training survives
    assert re.match(r"loss became (nan|inf) at step \d+", diverged["diverged"]), diverged
    finite = race_stability.one_run("cnn", 1e-3, "off", 0, seconds=2)
    assert "diverged" not in finite and 0 < finite["epochs"] and 0.1 <= finite["accuracy"] <= 1, finite


def test_the_committed_gpu_check_is_a_full_run_on_a_gpu_and_each_failed_step_says_why():
    """The record on the results page: a full run (not --smoke) on a CUDA GPU; a step that failed keeps its error,
    whose last line the page shows (tools.results.gpu_check); a step the record lacks (one added to the check since
    it ran) is named on the page."""
    record = json.loads((BENCHMARKS / "results" / "gpu_check.json").read_text())
    assert not record["smoke"] and record["device"] != "cpu"
    ran = {(s["kind"], s["name"]) for s in record["steps"]}
    assert ran <= set(results.GPU_STEPS)
    where, _ = results.gpu_check()
    assert all(f"{kind} {name}" in where for kind, name in set(results.GPU_STEPS) - ran), where
    assert all(s["ok"] or s.get("error", "").strip() for s in record["steps"])
    _, rows = results.gpu_check()
    assert all(row[3].startswith("failed: ") == (row[1] == "no") for row in rows)


def test_a_missing_result_names_the_script_that_writes_it_and_a_missing_measurement_the_tool():
    with pytest.raises(FileNotFoundError, match=r"python benchmarks/no_such\.py"):
        results.benchmark_result("no_such")
    with pytest.raises(FileNotFoundError, match=r"no measurement 'no_such' in the package .*python -m tools\.results"):
        measurement("no_such")


def test_ablate_records_each_run_with_its_changed_settings_and_leaves_the_recipe_alone(tmp_path, monkeypatch):
    seen = []

    def fake_train(name, **kwargs):  # what train_recipe returns, without training; records the recipe it ran
        seen.append(recipes.RECIPES[name])
        one_view = {"test_accuracy_one_view": 0.79} if len(seen) == 2 else {}  # a run with test-time flips
        return {"test_accuracy": 0.8 + len(seen) / 100, "epochs": 15.5, "wall_seconds": 1770.0, "threads": 2,
                **one_view}  # no machine nor load: the lab adds them (benchmarks/machine.py)

    monkeypatch.setattr(recipes, "train_recipe", fake_train)
    before = recipes.RECIPES["cifar10"]
    ablate = benchmark("ablate")
    ablate.main(["cifar10", "--budget", "1775", "--record", "--results", str(tmp_path)])
    ablate.main(["cifar10", "--budget", "1775", "--set", 'train.amp="off"', "--set", "augment.padding=4",
                 "--record", "--results", str(tmp_path)])
    assert recipes.RECIPES["cifar10"] is before  # the change lived for the run only
    assert seen[1]["train"]["amp"] == "off" and seen[1]["augment"]["padding"] == 4
    assert "amp" not in before["train"]  # float32 on a CPU, the default
    stored = json.loads((tmp_path / "ablate_cifar10.json").read_text())
    assert [run["set"] for run in stored["runs"]] == [{}, {"train.amp": "off", "augment.padding": 4}]
    assert [run["test_accuracy"] for run in stored["runs"]] == pytest.approx([0.81, 0.82])
    assert [run["test_accuracy_one_view"] for run in stored["runs"]] == pytest.approx([0.81, 0.79])
    assert stored["runs"][1]["budget"] == 1775 and stored["runs"][1]["machine"]["cores"] > 0
    assert all(isinstance(stored["runs"][1][key], (float, type(None))) for key in ("cpu_load_before", "cpu_load_after"))
    settings = stored["runs"][1]["settings"]  # the whole recipe it trained, not only the changes
    assert settings["train"]["amp"] == "off" and settings["model"]["dim"] == before["model"]["dim"]
    assert "amp" not in stored["runs"][0]["settings"]["train"] and stored["runs"][0]["thread_changes"] == []


def test_bf16_speedup_alternates_the_two_steps_and_records_the_ratio(tmp_path, monkeypatch):
    throughput = benchmark("train_throughput")
    calls = []

    def fake_step(name, autocast=False, compiled=False):  # a float32 step takes 3 ms, a bf16 one 2 ms
        return lambda: calls.append(autocast) or time.sleep(0.003 if not autocast else 0.002)

    monkeypatch.setattr(throughput, "training_step", fake_step)
    result = throughput.bf16_speedup("cifar10", rounds=4)
    assert calls == [False, True] * 5  # a warm-up of each, then strictly alternated
    assert result["speedup"] == pytest.approx(1.5, rel=0.3) and result["fp32_ms"] > result["bf16_ms"]
    monkeypatch.setattr(throughput, "RESULTS", tmp_path)
    monkeypatch.setattr(throughput, "matmul_gflops", lambda *args, **kwargs: 100.0)
    monkeypatch.setattr(throughput, "step_flops_and_seconds", lambda *args, **kwargs: (1e9, 0.01))
    for _ in range(2):
        throughput.main(["--bf16", "--record", "--steps", "2"])
    runs = json.loads((tmp_path / "train_throughput_bf16.json").read_text())["runs"]
    assert len(runs) == 2 and [s["recipe"] for s in runs[0]["steps"]] == ["mnist", "cifar10"]  # appended
    assert runs[0]["steps"][1]["model"]["stem_channels"] == list(RECIPES["cifar10"]["model"]["stem_channels"])
    assert runs[0]["matmul_gflops"] == {"fp32_2048": 100.0, "bf16_512": 100.0, "fp32_512": 100.0}


def test_compile_speedup_counts_the_first_compiled_step_and_alternates_after_it(tmp_path, monkeypatch):
    throughput = benchmark("train_throughput")
    calls = []

    def fake_step(name, autocast=False, compiled=False):  # compiling 0.2 s once; then eager 2 ms, compiled 3 ms
        seconds = [0.2] if compiled else []

        def step():
            calls.append("compiled" if compiled else "eager")
            time.sleep(seconds.pop() if seconds else 0.003 if compiled else 0.002)
        return step

    monkeypatch.setattr(throughput, "training_step", fake_step)
    result = throughput.compile_speedup("cifar10", rounds=4)
    assert calls == ["compiled"] + ["eager", "compiled"] * 5  # compile, a warm-up of each, then alternated
    assert result["compile_seconds"] == pytest.approx(0.2, abs=0.1)
    assert result["speedup"] == pytest.approx(2 / 3, rel=0.3) and result["eager_ms"] < result["compiled_ms"]
    monkeypatch.setattr(throughput, "RESULTS", tmp_path)
    monkeypatch.setattr(throughput, "matmul_gflops", lambda *args, **kwargs: 100.0)
    monkeypatch.setattr(throughput, "step_flops_and_seconds", lambda *args, **kwargs: (1e9, 0.01))
    throughput.main(["--compile", "--record", "--steps", "2"])
    assert not (tmp_path / "train_throughput_bf16.json").exists()  # only what was asked for is recorded
    runs = json.loads((tmp_path / "train_throughput_compile.json").read_text())["runs"]
    assert [s["recipe"] for s in runs[0]["steps"]] == ["mnist", "cifar10"] and "compile_seconds" in runs[0]["steps"][0]


def test_short_schedule_low_res_forward_at_full_size_is_the_model_itself():
    short = benchmark("short_schedule")
    torch.manual_seed(0)
    model = ViT(**RECIPES["cifar10"]["model"]).eval()
    images = torch.randn(3, 3, 32, 32)
    # factor 1: no pooling and the token centres at the grid's own integer positions, so the same positions table
    assert torch.allclose(short.low_res_forward(model, images, 1), model(images), atol=1e-5)
    assert short.low_res_forward(model, images, 2).shape == (3, 10)  # 16 px images: a grid half as wide
    table = sincos_position_embedding(4, 128, start=0.5, step=2)  # a 4 x 4 low grid's centres 0.5, 2.5, 4.5, 6.5
    assert table.shape == (16, 128) and not torch.allclose(table, sincos_position_embedding(4, 128))


@needs_data
def test_short_schedule_records_both_phases_and_an_ema_of_decay_zero_is_the_model(tmp_path):
    short = benchmark("short_schedule")
    args = ["--low", "0.5", "--high", "0.5", "--ema", "0", "0.5", "--subset", "256", "--record",
            "--results", str(tmp_path)]
    run = short.main(args)
    assert run["steps"] == 4 and run["low_seconds"] > 0 and run["high_seconds"] > 0  # 256 images: 4 batches of 64
    assert run["ema"]["0.0"]["test_loss"] == pytest.approx(run["test_loss"], abs=1e-6)  # decay 0: the last weights
    assert run["ema"]["0.5"]["test_loss"] != pytest.approx(run["test_loss"], abs=1e-6)
    stored = json.loads((tmp_path / "short_schedule_cifar10.json").read_text())
    assert stored["runs"][0]["low_epochs"] == 0.5 and stored["runs"][0]["machine"]["cores"] > 0
    with pytest.raises(SystemExit):
        short.main(["--ema", "1.0"])
    mnist = short.main(["--recipe", "mnist", "--high", "1", "--subset", "256", "--record", "--results", str(tmp_path)])
    assert mnist["steps"] == 2 and mnist["settings"]["model"]["in_channels"] == 1  # 256 images: 2 batches of 128
    assert json.loads((tmp_path / "short_schedule_mnist.json").read_text())["recipe"] == "mnist"
    low = short.main(["--recipe", "mnist", "--low", "0.5", "--high", "0.5", "--subset", "256"])  # 14 px: a 2 x 2 grid
    assert low["low_seconds"] > 0 and 0 <= low["test_accuracy"] <= 1
    with pytest.raises(ValueError, match="grid of 4 tokens a side cannot be pooled by 3"):  # MNIST's 4 x 4 grid
        short.train(1, 0, [], subset=256, factor=3, name="mnist")


def test_stem_speed_times_the_two_stems_it_is_given(tmp_path, monkeypatch):
    speed = benchmark("stem_speed")
    built, real = [], speed.training_step
    monkeypatch.setattr(speed, "training_step",
                        lambda name, changes: built.append(changes["stem_channels"]) or real(name, changes=changes))
    result = speed.main(["mnist", "(4, 8)", "(4, 8, 8)", "--rounds", "1", "--record", "--results", str(tmp_path)])
    assert built == [(4, 8), (4, 8, 8)] and result["stems"] == [[4, 8], [4, 8, 8]]
    assert result["first_ms"] > 0 and result["second_ms"] > 0 and result["batch_size"] == 128
    stored = json.loads((tmp_path / "stem_speed.json").read_text())
    assert stored["runs"] == [json.loads(json.dumps(result))] and stored["runs"][0]["machine"]["cores"] > 0


def test_flip_tta_refuses_a_model_that_is_not_cifar10s(tmp_path):
    save_checkpoint(tmp_path / "mnist.pt", ViT(**RECIPES["mnist"]["model"]))
    with pytest.raises(ValueError, match="not a CIFAR-10 model"):
        benchmark("flip_tta").measure(tmp_path / "mnist.pt")


@needs_data
def test_flip_tta_records_both_accuracies_of_each_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = ViT(**RECIPES["cifar10"]["model"])
    with torch.no_grad():  # spread the weights: a fresh model gives every image, and its mirror, the same class
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    save_checkpoint(tmp_path / "model.pt", model, metrics={"epochs": 0, "seed": 0}, recipe="cifar10")
    runs = benchmark("flip_tta").main([str(tmp_path / "model.pt"), "--subset", "256", "--record", "--results",
                                       str(tmp_path)])
    stored = json.loads((tmp_path / "flip_tta.json").read_text())
    assert stored["runs"] == runs and runs[0]["recipe"] == "cifar10" and runs[0]["machine"]["cores"] > 0
    # both accuracies computed here without evaluate_flips: each image as it is, and the two views' mean probabilities

    model, _ = load_checkpoint(tmp_path / "model.pt")
    *_, test = loaders("cifar10", 256, augment=False)
    test.images, test.labels = test.images[:256], test.labels[:256]
    (images, labels), = list(test)  # one batch of 256, normalised as the loader does
    with torch.no_grad():
        probs = model.eval()(images).softmax(-1)
        both = (probs + model(images.flip(-1)).softmax(-1)) / 2
    assert runs[0]["test_accuracy"] != runs[0]["flip_accuracy"]  # else a swap of the two would pass
    assert runs[0]["test_accuracy"] == pytest.approx((probs.argmax(-1) == labels).float().mean().item())
    assert runs[0]["flip_accuracy"] == pytest.approx((both.argmax(-1) == labels).float().mean().item())


def readme_table_names(text):
    """The `x.py` and `x.json` names in the rows of benchmarks/README.md's table: {"py": ..., "json": ...}."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    names = {name for row in rows for name in re.findall(r"`([\w.-]+\.(?:py|json))`", row)}
    return {ext: {n for n in names if n.endswith(f".{ext}")} for ext in ("py", "json")}


@pytest.mark.repo_text
def test_the_benchmarks_readme_names_every_script_and_every_result_file():
    """One row per question: benchmarks/README.md names each script and each stored result, and nothing that is not
    there (a result a script would write but never has is named without backticks)."""
    named = readme_table_names((BENCHMARKS / "README.md").read_text())
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    stored = {p.name for p in (BENCHMARKS / "results").glob("*.json")}
    assert scripts - named["py"] == set(), "scripts missing from benchmarks/README.md"
    assert stored - named["json"] == set(), "result files missing from benchmarks/README.md"
    assert named["py"] - scripts == set() and named["json"] - stored == set(), "the README names files not there"


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_the_shipped_time_budgeted_models_meet_their_targets(name):
    """The README's promise (MNIST 99.3 % in 300 s, CIFAR-10 80 % in 1,800 s, the whole command) held by the run
    that ships: its metrics.json, against targets.py's TARGETS. Seeds and machines are targets.json's business."""
    accuracy, seconds = benchmark("targets").TARGETS[name]
    shipped = json.loads((pretrained_path(name).parent / "metrics.json").read_text())
    assert shipped["test_accuracy"] >= accuracy and shipped["wall_seconds"] <= seconds, shipped


def test_step_overhead_counts_a_strong_recipe_and_records_it(tmp_path, monkeypatch):
    overhead = benchmark("step_overhead")
    tiny = {"dataset": "cifar10", "model": dict(image_size=32, patch_size=1, in_channels=3, num_classes=10, dim=16,
                                                depth=1, num_heads=2, stem_channels=(8, 8, 8)),
            "train": dict(batch_size=8, label_smoothing=0.1),
            "augment": dict(padding=4, rand_ops=2, magnitude=9), "mix": dict(cutmix=1.0, mixup=0.8)}
    monkeypatch.setattr(overhead, "RECIPES", {"tiny": tiny})
    overhead.main(["tiny", "--steps", "1", "--rounds", "1", "--record", "--results", str(tmp_path)])
    (run,) = json.loads((tmp_path / "step_overhead.json").read_text())["runs"]
    row = run["recipes"]["tiny"]
    assert row["whole_step"] == {"graphs": 2, "breaks": 0}, row["break_reasons"]  # batch to gradients; AdamW
    assert row["host_reads"] == 0 and row["ops"] > 100 and row["images_per_s"] > 0
    assert run["device"] == "cpu" and run["machine"]["cores"] > 0
