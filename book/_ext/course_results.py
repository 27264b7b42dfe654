"""The results table, generated at build time from the shipped runs' metrics (no number typed by hand).

`{results-table}` reads `vit_course/checkpoints/<run>/metrics.json` for each run (written by
`python -m vit_course train <run>`: `test_accuracy` in 0..1, `train_seconds`, `epochs`, `params`, `device`)
and renders one row per run with the command that reproduces it; a run whose file is missing gets a
"not yet trained" row. Each file is a dependency of the page, so retraining and rebuilding updates it.
"""

import json
import math
from pathlib import Path

from course_chapters import make_table
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

RUNS = (("mnist", "MNIST"), ("cifar10", "CIFAR-10"), ("cifar10-plain", "CIFAR-10, paper-style ViT"))
HEADER = ["Run", "Test accuracy", "Training time", "Epochs", "Parameters", "Device", "Reproduce with"]


def format_seconds(seconds):
    """412.3 -> '6 min 52 s'; under a minute, '48 s'."""
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


def results_rows(checkpoints):
    """One row of strings per run in RUNS, from `checkpoints/<run>/metrics.json` (HEADER gives the columns)."""
    rows = []
    for run, label in RUNS:
        path = Path(checkpoints) / run / "metrics.json"
        command = f"python -m vit_course train {run}"
        if not path.is_file():
            rows.append([label, "not yet trained", "—", "—", "—", "—", command])
            continue
        m = read_metrics(path)
        command = m.get("command") or command
        rows.append([label, f"{100 * m['test_accuracy']:.2f} %", format_seconds(m["train_seconds"]),
                     str(m.get("epochs", "—")), format_count(m["params"]) if "params" in m else "—",
                     str(m.get("device", "—")), command])
    return rows


class ResultsTable(SphinxDirective):
    """`{results-table}`: the table of shipped runs, then each run's curves when the checkpoint has them."""

    option_spec = {"checkpoints": directives.unchanged}

    def run(self):
        rel = self.options.get("checkpoints", "../vit_course/checkpoints")  # relative to the book's folder
        checkpoints = (Path(self.env.srcdir) / rel).resolve()
        for run, _ in RUNS:
            self.env.note_dependency(str(checkpoints / run / "metrics.json"))  # rebuild when it appears/changes
        try:
            rows = results_rows(checkpoints)
        except (ValueError, KeyError) as err:
            logger.warning("results table: %s", err, location=self.get_location())
            return []
        body = []
        for row in rows:
            code = nodes.paragraph()
            code += nodes.literal(text=row[-1])
            body.append([*row[:-1], code])
        out = [make_table(HEADER, body, widths=[12, 12, 12, 8, 10, 8, 38])]
        for run, label in RUNS:
            curves = checkpoints / run / "curves.png"
            if curves.is_file():
                figure = nodes.figure()
                # "/" = relative to the book's folder; Sphinx copies the file into the build.
                figure += nodes.image(uri="/" + str(Path(rel) / run / "curves.png"), alt=f"{label} curves")
                figure += nodes.caption(text=f"{label}: training curves of the shipped run.")
                out.append(figure)
        return out


def setup(app):
    app.add_directive("results-table", ResultsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
