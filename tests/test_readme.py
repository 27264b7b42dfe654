"""The README's results table shows the shipped models' stored metrics, not numbers typed by hand."""

import json
import re
from pathlib import Path

import pytest

from tools.results import epochs_cell
from vit_course.results import accuracy_cell

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.repo_text
@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar10-plain", "cifar10-plain-basic"])
def test_results_table_matches_shipped_metrics(name):
    metrics = json.loads((ROOT / "vit_course" / "checkpoints" / name / "metrics.json").read_text())
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if f"`python -m vit_course train {name}`" in line and line.startswith("|"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == accuracy_cell(metrics)
    assert cells[3] == epochs_cell(metrics)
    assert cells[4] == f"{metrics['train_seconds']:.0f} s"
    assert cells[5] == f"{metrics['params']:,}"


def test_epochs_cell_says_whether_the_epochs_were_planned_or_filled_the_budget():
    assert epochs_cell({"epochs": 3.0, "planned_epochs": 3}) == "3.00 of 3"
    assert epochs_cell({"epochs": 7.456, "planned_epochs": None}) == "7.46 (as many as the budget held)"


def test_accuracy_cell_names_test_time_flips_and_gives_the_one_view_accuracy_beside():
    assert accuracy_cell({"test_accuracy": 0.99356}) == "99.36%"
    assert accuracy_cell({"test_accuracy": 0.99356, "test_flips": False, "test_accuracy_one_view": 0.99356}) == "99.36%"
    flips = {"test_accuracy": 0.8156, "test_flips": True, "test_accuracy_one_view": 0.8108}
    assert accuracy_cell(flips) == "81.56% with test-time flips (81.08% one view)"
    assert accuracy_cell(flips, lambda f: f"{100 * f:.1f} %") == "81.6 % with test-time flips (81.1 % one view)"


@pytest.mark.repo_text
def test_readme_quick_start_is_make_book_and_make_test():
    text = (ROOT / "README.md").read_text()
    quick = re.search(r"## Quick start(.*?)\n## ", text, re.S).group(1)
    assert "make book" in quick and "make test" in quick
    assert "pytest --nbval-lax notebooks/" in text and "VIT_COURSE_DATA" in text


def test_readme_results_table_is_written_from_the_metrics(tmp_path):
    from tools import results

    assert results.main(["--check"]) == 0, "run `python -m tools.results`"
    for run, _ in results.RUNS[:2]:  # a retrained run changes the table
        (tmp_path / run).mkdir()
        metrics = json.loads((ROOT / "vit_course" / "checkpoints" / run / "metrics.json").read_text())
        (tmp_path / run / "metrics.json").write_text(json.dumps({**metrics, "test_accuracy": 0.5}))
    text = (ROOT / "README.md").read_text()
    changed = results.readme_with_table(text, tmp_path)
    assert changed != text and "| 50.00% |" in changed
    assert "cifar10-plain" not in "\n".join(results.readme_table(tmp_path))  # not shipped: no row
    readme = tmp_path / "README.md"
    readme.write_text(changed)
    assert results.main(["--check", "--readme", str(readme)]) == 1


@pytest.mark.repo_text
def test_every_variant_row_of_the_seeds_table_has_its_description():
    from tools.results import seed_rows, variant_notes

    variant_rows = [row[0] for row in seed_rows() if "," in row[0]]  # "RECIPE, VARIANT"
    notes = dict(variant_notes())
    assert sorted(notes) == sorted(variant_rows) and all(len(text) > 20 for text in notes.values())
