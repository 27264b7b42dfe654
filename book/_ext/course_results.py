"""The results table, generated at build time from the shipped runs' metrics by ``tools.results`` (no number
typed by hand).

`{results-table}` reads `vit_course/checkpoints/<run>/metrics.json` for each run (written by
`python -m vit_course train <run>`: `test_accuracy` in 0..1, `train_seconds`, `epochs`, `params`, `device`)
and renders one row per run with the command that reproduces it; a run whose file is missing gets a
"not yet trained" row. Each file is a dependency of the page, so retraining and rebuilding updates it.
"""

from pathlib import Path

from course_chapters import make_table
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from tools.results import (  # noqa: F401
    BENCHMARKS,
    BOOK_HEADER,
    GPU_HEADER,
    RUNS,
    SEEDS_HEADER,
    book_rows,
    format_seconds,
    gpu_check,
    read_metrics,
    seed_rows,
    variant_notes,
)

logger = logging.getLogger(__name__)
HEADER = BOOK_HEADER


def results_rows(checkpoints):
    """The book's rows, from ``tools.results`` (the README's table comes from the same place)."""
    return book_rows(checkpoints)


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
        out = [make_table(HEADER, body, widths=[12, 12, 10, 8, 10, 8, 10, 30])]
        self.env.note_dependency(str(BENCHMARKS / "targets.json"))
        seeds = seed_rows()
        if seeds:
            caption = nodes.paragraph(text="Each time-budgeted recipe run with several seeds, one after another "
                                           "(python benchmarks/targets.py NAME --runs 3 --record):")
            out += [caption, make_table(SEEDS_HEADER, seeds, widths=[8, 8, 12, 6, 24, 10, 12, 20])]
            notes = nodes.bullet_list()  # what each row that is not a recipe as it stands was
            for label, description in variant_notes():
                item = nodes.paragraph()
                item += [nodes.literal(text=label), nodes.Text(f": {description}")]
                notes += nodes.list_item("", item)
            out += [nodes.paragraph(text="The rows named RECIPE, VARIANT:"), notes] if len(notes) else []
        for run, label in RUNS:
            curves = checkpoints / run / "curves.png"
            if curves.is_file():
                figure = nodes.figure()
                # "/" = relative to the book's folder; Sphinx copies the file into the build.
                figure += nodes.image(uri="/" + str(Path(rel) / run / "curves.png"), alt=f"{label} curves")
                figure += nodes.caption(text=f"{label}: training curves of the shipped run.")
                out.append(figure)
        return out


class GpuCheckTable(SphinxDirective):
    """`{gpu-check-table}`: the last full GPU check (benchmarks/results/gpu_check.json), a row per step."""

    def run(self):
        self.env.note_dependency(str(BENCHMARKS / "gpu_check.json"))
        where, rows = gpu_check()
        if where is None:
            return [nodes.paragraph(text="No GPU check is recorded yet: python benchmarks/gpu_check.py records one.")]
        return [nodes.paragraph(text=where), make_table(GPU_HEADER, rows, widths=[14, 4, 6, 50])]


def setup(app):
    app.add_directive("results-table", ResultsTable)
    app.add_directive("gpu-check-table", GpuCheckTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
