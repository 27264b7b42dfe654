"""The Jupyter Book: all nine chapters, offline assets and MathJax, Colab links, folded solutions, results table, and
the appendix "How the recipes were chosen" with its tables generated from benchmarks/results.

One real build of book/ into a temporary folder (shared by the tests below), one build of a scratch copy
that must fail, and unit tests of the build's helpers. Marked `book`: `pytest -m "not book"` skips it.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
sys.path.insert(0, str(BOOK / "_ext"))
_spec = importlib.util.spec_from_file_location("book_build", BOOK / "build.py")
book_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(book_build)

import course_recipes  # noqa: E402
from course_chapters import COLAB_LINK, fold_solutions, point_book_links, strip_markers  # noqa: E402
from course_results import format_seconds, read_metrics, results_rows  # noqa: E402

from tools.results import benchmark_result, seed_rows  # noqa: E402

pytestmark = pytest.mark.book
CHAPTERS = book_build.CHAPTERS


# ---- helpers, no build -------------------------------------------------------------------------------------

@pytest.mark.repo_text
def test_toc_lists_the_nine_chapters_in_order_then_the_reference_pages_and_the_appendix():
    toc = (BOOK / "_toc.yml").read_text()
    assert re.findall(r"file:\s*chapters/(\S+)", toc) == list(CHAPTERS)
    assert re.findall(r"file:\s*(\w+)\b(?!/)", toc) == ["results", "glossary", "references", "recipes", "heads_study"]


def test_chapter_links_to_the_book_pages_point_from_the_chapters_folder():
    nb = {"cells": [{"cell_type": "markdown", "source": ["See [the appendix](../book/recipes.md) and\n",
                                                         "[results](../book/results.md#seeds)."]},
                    {"cell_type": "code", "source": "link = '](../book/recipes.md)'"}]}
    assert point_book_links(nb) == 2
    assert nb["cells"][0]["source"] == "See [the appendix](../recipes.md) and\n[results](../results.md#seeds)."
    assert nb["cells"][1]["source"] == "link = '](../book/recipes.md)'"  # code is left alone


@pytest.mark.repo_text
def test_the_chapters_links_to_the_book_name_pages_that_exist():
    for name in CHAPTERS:  # in the repository the same links open the page from solutions/ and notebooks/
        text = (ROOT / "solutions" / f"{name}.ipynb").read_text()
        for page in re.findall(r"\]\(\.\./book/([\w-]+\.md)", text):
            assert (BOOK / page).is_file(), (name, page)


# ---- the appendix's tables, no build ------------------------------------------------------------------------

APPENDIX = (BOOK / "recipes.md").read_text()
PAGES = {page: (BOOK / f"{page}.md").read_text() for page in course_recipes.PAGES}  # the appendix and heads_study


@pytest.mark.repo_text
def test_the_appendix_shows_every_table_once_and_names_no_other():
    for page, text in PAGES.items():
        assert re.findall(r"```\{recipe-table\} (\S+)", text) == course_recipes.PAGES[page], page
    assert sum(course_recipes.PAGES.values(), []) == list(course_recipes.TABLES)


def test_the_heads_study_reads_one_gap_one_way():
    """The optional page's CutMix control: each epoch's gap between the two runs, and the spread it is read against
    (two seeds of chapter 07's runs), come from the stored results."""
    _, cutmix = course_recipes.table("heads-cutmix")
    _, data = course_recipes.table("heads-data")
    gaps = [float(row[-1].split(",")[0]) for row in cutmix]
    spread = max(float(row[2]) for row in data)
    assert len(gaps) >= 3 and max(gaps) <= spread, "the page calls every gap level: no longer inside the spread"
    assert "a difference inside the\nmeasured spread is level" in PAGES["heads_study"]


def test_the_heads_study_code_runs():
    """The page's one code block (a batch as the training loop augments it) runs on the package as it is."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    (code,) = re.findall(r"```python\n(.*?)```", PAGES["heads_study"], re.S)
    exec(code, {})
    plt.close("all")


@pytest.mark.parametrize("name", list(course_recipes.TABLES))
def test_each_appendix_table_is_rectangular_and_not_empty(name):
    header, rows = course_recipes.table(name)
    assert rows and all(len(row) == len(header) for row in rows), name
    assert all(isinstance(cell, str) and cell for row in rows for cell in row), name


@pytest.mark.parametrize("name, result", [("ablate-mnist", "ablate_mnist"), ("ablate-cifar10", "ablate_cifar10"),
                                          ("flip-tta", "flip_tta")])
def test_appendix_tables_follow_the_stored_runs(name, result):
    runs = benchmark_result(result)["runs"]
    if name == "ablate-cifar10":  # the crop comparison's runs have their own table
        runs = [run for run in runs if not course_recipes.crop_comparison(run)]
    if name == "ablate-mnist":  # so do the runs that chose the stem again on validation
        runs = [run for run in runs if not course_recipes.on_validation(run)]
    header, rows = course_recipes.table(name)
    column = [h for h in header if h in ("test accuracy", "one view")][0]
    assert [row[header.index(column)].split()[0] for row in rows] == [f"{100 * r['test_accuracy']:.2f}%" for r in runs]
    assert [row[header.index("epochs")] for row in rows] == [f"{r['epochs']:.2f}" for r in runs]


def test_the_crop_table_puts_the_validation_runs_first_and_marks_the_earlier_ones():
    result = {"runs": [
        {"set": {}, "seed": 0, "machine": {}, "epochs": 40.0, "test_accuracy": 0.83, "test_accuracy_one_view": 0.81,
         "settings": {"augment": {"padding": 0}}},
        {"set": {"augment.padding": 4}, "seed": 1, "machine": {}, "epochs": 39.5, "test_accuracy": 0.845,
         "test_accuracy_one_view": 0.83, "val_accuracy": 0.8412, "settings": {"augment": {"padding": 0}}},
        {"set": {"train.lr": 0.003}, "seed": 0, "machine": {}, "epochs": 9.0, "test_accuracy": 0.7,
         "settings": {"augment": {"padding": 0}}}]}
    header, rows = course_recipes.crop_cifar10(result)
    assert len(rows) == 2  # the learning-rate run is not part of the comparison
    row = dict(zip(header, rows[0], strict=True))
    assert (row["training images"], row["crop"], row["seed"], row["validation accuracy"]) == (
        "45,000", "padding 4", "1", "84.12%")
    row = dict(zip(header, rows[1], strict=True))
    assert (row["training images"], row["crop"], row["validation accuracy"]) == ("50,000", "none", "not held out")


def test_the_plain_vit_tables_follow_their_records():
    header, rows = course_recipes.table("plain-findings")
    runs = benchmark_result("plain_findings")["runs"]
    expected = [(run["recipe"], f"{run['epoch']:g}", f"{100 * run['test_accuracy']:.2f}%") for run in runs]
    assert [(r[0], r[1], r[2]) for r in rows] == expected
    local = header.index("most local head, layers 1-2")
    assert [r[local] for r in rows] == [f"{run['min_ratio_layers_1_2']:.2f}x" for run in runs]
    _, rows = course_recipes.table("plain-protocol-start")
    assert [r[0] for r in rows] == ["p = 1", "p = 0.5"]  # the first start applied every op (no rand_prob recorded)


def test_an_appendix_table_changes_with_its_result():
    result = benchmark_result("stem_speed")
    _, before = course_recipes.stem_speed(result)
    result["runs"][0].update(first_ms=200.0, speedup=5.362)
    _, after = course_recipes.stem_speed(result)
    assert after[0][3] == f"200.0 against {result['runs'][0]['second_ms']:.1f}" and after[0][4].startswith("5.36x")
    assert after[1:] == before[1:]
    assert course_recipes.threads_cell({"threads": 2, "thread_changes": [[5.7, 1], [52.3, 2]]}) == "2, 1 at times"
    assert course_recipes.threads_cell({"threads": 1, "thread_changes": [[82.6, 1], [92.7, 2]]}) == "2, 1 at times"
    assert course_recipes.threads_cell({"threads": 2, "thread_changes": [[86.6, 2]]}) == "2 from 87 s"
    assert course_recipes.threads_cell({"threads": 1, "thread_changes": []}) == "1"
    assert course_recipes.machine_name({"cpu": "Intel(R) Xeon(R) Processor", "amx": True}) == "Intel Xeon, AMX"


@pytest.mark.repo_text
def test_the_appendix_prose_quotes_only_accuracies_its_tables_show():
    """A percentage typed in the page's text must be one the generated tables (or the results page's seeds) show,
    so a re-recorded benchmark cannot leave the prose quoting a number that no table holds any more."""
    shown = {cell for name in course_recipes.TABLES for row in course_recipes.table(name)[1] for cell in row}
    shown |= {cell for row in seed_rows() for cell in row}
    shown = " ".join(shown)
    for page, text in PAGES.items():
        prose = re.sub(r"```.*?```", " ", text, flags=re.S)
        quoted = re.findall(r"\d+\.\d\d%", prose)
        assert quoted or page != "recipes", "the page quotes no accuracy: nothing to check"
        missing = sorted({q for q in quoted if q not in shown})
        assert missing == [], f"book/{page}.md quotes accuracies that no table shows: {missing}"


@pytest.mark.repo_text
def test_the_appendix_opens_with_a_summary_that_links_every_section():
    """After its first paragraph the appendix shows one table of its decisions (decision, evidence, effect, seeds),
    and the evidence column links every section of the page, so a new section cannot go unsummarised."""
    intro, rest = APPENDIX.split("\n\n", 2)[1:]
    assert rest.startswith(":::{table}") and ":name: recipes-decisions" in rest.split("\n\n", 1)[0], intro
    summary = rest.split("\n:::\n", 1)[0]
    assert "| decision | evidence | effect | seeds |" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 10 and all(line.count(" | ") == 3 for line in rows)
    labels = set(re.findall(r"^\((recipes-[\w-]+)\)=$", APPENDIX, re.M))
    linked = set(re.findall(r"\]\(#(recipes-[\w-]+)\)", summary))
    assert labels and labels == linked, (labels - linked, linked - labels)


def test_fold_solutions_tags_exercise_cells_only():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("checks.f(f)"),
        nbformat.v4.new_markdown_cell("Write `### BEGIN SOLUTION` in a code cell"),
        nbformat.v4.new_code_cell(["x = 1\n", "### BEGIN SOLUTION\n"], metadata={"tags": ["remove-input"]}),
    ])
    nb = json.loads(nbformat.writes(nb))
    assert fold_solutions(nb) == 2
    tags = [c["metadata"].get("tags", []) for c in nb["cells"]]
    assert tags == [["hide-input"], [], [], ["remove-input"]]  # an author's own hiding tag is kept
    assert nb["cells"][0]["metadata"]["mystnb"]["code_prompt_show"] == "Show solution"
    assert fold_solutions(nb) == 2 and nb["cells"][0]["metadata"]["tags"] == ["hide-input"]  # idempotent


def test_strip_markers_drops_the_grading_markers_and_keeps_the_code():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("class A:\n    def g(self):\n        ### BEGIN SOLUTION g\n        ### BEGIN HINT\n"
                                  "        # look up\n        ### END HINT\n        pass\n        ### END SOLUTION\n"),
        nbformat.v4.new_markdown_cell("Write `### BEGIN SOLUTION` in a code cell"),
        nbformat.v4.new_code_cell("x = 1  # no marker"),
    ])
    nb = json.loads(nbformat.writes(nb))
    assert fold_solutions(nb) == 2 and strip_markers(nb) == 2
    assert ["".join(c["source"]) for c in nb["cells"]] == [
        "def f(x):\n    return x", "class A:\n    def g(self):\n        # look up\n        pass",
        "Write `### BEGIN SOLUTION` in a code cell", "x = 1  # no marker"]
    assert nb["cells"][0]["metadata"]["tags"] == ["hide-input"]  # still folded
    assert strip_markers(nb) == 0


def test_external_fetches_finds_remote_assets_but_not_links():
    html = """<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>
    <link rel="stylesheet" href="//fonts.googleapis.com/css?family=Lato"><img src='http://x.org/a.png'>
    <a href="https://arxiv.org/abs/2010.11929">paper</a><script src="_static/mathjax/tex-chtml.js"></script>
    <link rel="next" href="02.html"><script>var icons = {"src": "https://example.com/icon.svg"};</script>
    <style>@font-face { src: url(../fonts/a.woff2) }</style>"""
    assert book_build.external_fetches(html) == [
        "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js", "//fonts.googleapis.com/css?family=Lato",
        "http://x.org/a.png"]
    css = "@import 'https://fonts.googleapis.com/css2'; a { background: url(data:image/svg+xml,x) }" \
          " b { src: url('https://x.org/f.woff') }"
    assert book_build.external_fetches(css, css=True) == ["https://fonts.googleapis.com/css2", "https://x.org/f.woff"]


def test_results_rows_from_metrics_and_missing_runs(tmp_path):
    (tmp_path / "mnist").mkdir()
    metrics = {"test_accuracy": 0.9912, "train_seconds": 251.6, "epochs": 12, "params": 210_442, "device": "cpu"}
    (tmp_path / "mnist" / "metrics.json").write_text(json.dumps(metrics))
    mnist, cifar, plain, basic = results_rows(tmp_path)
    assert mnist == ["MNIST", "99.12 %", "4 min 12 s", "12.00 (as many as the budget held)", "210 k", "cpu", "float32",
                     "python -m vit_course train mnist"]
    assert cifar[:2] == ["CIFAR-10", "not yet trained"] and cifar[-1] == "python -m vit_course train cifar10"
    assert plain[1] == "not yet trained" and plain[-1] == "python -m vit_course train cifar10-plain"
    assert basic[1] == "not yet trained" and basic[-1] == "python -m vit_course train cifar10-plain-basic"
    assert format_seconds(3725) == "1 h 2 min" and format_seconds(48.4) == "48 s"


@pytest.mark.parametrize("bad", [{"test_accuracy": 99.1, "train_seconds": 3}, {"test_accuracy": 0.9},
                                 {"test_accuracy": "0.9", "train_seconds": 3}, [0.9]])
def test_read_metrics_rejects_bad_files(tmp_path, bad):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="metrics.json"):
        read_metrics(path)


# ---- the real book -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def html(tmp_path_factory):
    """book/ built into a temporary folder exactly as `make book` does (warnings as errors, offline check)."""
    missing = book_build.missing_chapters()
    assert not missing, f"chapters not written yet (solutions/): {missing}"
    return book_build.build(tmp_path_factory.mktemp("book"))


def chapter_pages(html):
    return {name: (html / "chapters" / f"{name}.html").read_text() for name in CHAPTERS}


def test_every_chapter_is_built_and_in_the_navigation(html):
    index = (html / "index.html").read_text()
    for name in CHAPTERS:
        assert (html / "chapters" / f"{name}.html").is_file(), name
        assert f'href="chapters/{name}.html"' in index, f"{name} missing from the navigation"
    for page in ("results", "glossary", "references", "recipes", "heads_study"):
        assert f'href="{page}.html"' in index


def test_no_asset_comes_from_outside(html):
    assert book_build.external_assets(html) == []
    pages = list(html.rglob("*.html"))
    assert len(pages) >= len(CHAPTERS) + 4
    for page in pages:
        assert not re.search(r"""<(?:script|img|iframe)\b[^>]*\bsrc=["']?(?:https?:)?//""", page.read_text()), page


def test_mathjax_is_served_from_the_book(html):
    chtml = html / "_static" / "mathjax" / "tex-chtml.js"
    assert chtml.is_file() and 'VERSION="3.' in (html / "_static" / "mathjax" / "startup.js").read_text()
    assert list((html / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert (html / "_static" / "mathjax" / "input" / "tex" / "extensions" / "boldsymbol.js").is_file()
    with_math = [p for p in html.rglob("*.html") if 'class="math' in p.read_text()]
    assert len(with_math) >= 2  # the glossary and at least one chapter have equations
    for page in with_math:
        text = page.read_text()
        scripts = re.findall(r"""<script[^>]*src=["']([^"']*mathjax[^"']*)""", text)
        assert scripts, f"{page.name} has math but loads no MathJax"
        for src in scripts:
            assert (page.parent / src.split("?")[0]).resolve() == chtml.resolve(), (page.name, src)


def test_each_chapter_links_to_colab_for_its_student_notebook(html):
    for name, text in chapter_pages(html).items():
        targets = {m["path"] for m in COLAB_LINK.finditer(text)}
        assert targets == {f"notebooks/{name}.ipynb"}, (name, targets)
        assert (ROOT / "notebooks" / f"{name}.ipynb").is_file(), name
        assert "colab-badge.svg" in text and "colab.research.google.com/assets" not in text, name


def test_solutions_are_folded_with_outputs_visible(html):
    for name, text in chapter_pages(html).items():
        nb = nbformat.read(BOOK / "chapters" / f"{name}.ipynb", as_version=4)
        exercises = [c for c in nb.cells if c.cell_type == "code" and "### BEGIN SOLUTION" in c.source]
        folded = re.findall(r'<div class="cell tag_hide-input[^"]*">\s*<details class="[^"]*hide above-input', text)
        assert len(folded) == len(exercises), (name, len(folded), len(exercises))
        assert text.count("Show solution") == len(exercises), name
        assert "hide below-input" not in text, f"{name}: an output is folded"


def test_no_page_shows_the_grading_markers(html):
    """The solutions are shown without `### BEGIN SOLUTION` / `### END SOLUTION` (folded ones included), and no
    file of the built site has them: not the search index, not the chapters' ".ipynb" downloads (_sources/)."""
    files = [p for p in html.rglob("*") if p.is_file() and (p.suffix in (".html", ".js", ".ipynb", ".txt")
                                                            or ".ipynb" in p.name)]
    assert any("_sources" in p.parts and ".ipynb" in p.name for p in files), "no chapter notebook to download"
    shown = {p.relative_to(html).as_posix(): n for p in files
             if (n := len(re.findall(r"(?:BEGIN|END)(?:<[^>]*>|\s)*SOLUTION", p.read_text(errors="replace"))))}
    assert not shown, f"grading markers in the built book: {shown}"
    folded = sum(chapter.count("Show solution") for chapter in chapter_pages(html).values())
    assert folded >= 20  # the solutions are still there, folded


def test_results_table_is_generated_from_the_metrics(html):
    text = (html / "results.html").read_text()
    for row in results_rows(ROOT / "vit_course" / "checkpoints"):
        cells = re.search(rf"<tr[^>]*>\s*<td[^>]*><p>{re.escape(row[0])}</p></td>(.*?)</tr>", text, re.S)
        assert cells, f"no row for {row[0]}"
        tds = re.findall(r"<td.*?</td>", cells.group(1), re.S)
        plain = [" ".join(re.sub(r"<[^>]+>", " ", td).split()) for td in tds]  # cell texts, tags dropped
        assert plain == row[1:], (row, plain)


def test_appendix_tables_are_generated_from_the_stored_results(html):
    pages = {page: [table for table in re.findall(r"<table.*?</table>", (html / f"{page}.html").read_text(), re.S)
                    if 'id="recipes-decisions"' not in table.split(">", 1)[0]]  # the typed summary, not generated
             for page in course_recipes.PAGES}
    assert [len(tables) for tables in pages.values()] == [len(names) for names in course_recipes.PAGES.values()]
    for name, table in zip(sum(course_recipes.PAGES.values(), []), sum(pages.values(), []), strict=True):
        header, rows = course_recipes.table(name)
        shown = [[" ".join(re.sub(r"<[^>]+>", " ", td).split()) for td in re.findall(r"<t[dh].*?</t[dh]>", tr, re.S)]
                 for tr in re.findall(r"<tr.*?</tr>", table, re.S)]
        assert shown == [[html_unescaped(c) for c in header], *[[html_unescaped(c) for c in row] for row in rows]], name
    for name in ("06_train_mnist", "07_train_cifar10", "09_going_further"):  # the text, not the navigation
        article = re.search(r"<article\b.*?</article>", (html / "chapters" / f"{name}.html").read_text(), re.S)
        assert 'href="../recipes.html"' in article.group(0), f"{name} does not link to the appendix"


def html_unescaped(cell):
    """A cell's text as the HTML writes it (quotes and ampersands escaped)."""
    return cell.replace("&", "&amp;").replace('"', "&quot;").replace("'", "&#x27;").replace("<", "&lt;")


def test_a_notebook_left_out_of_the_toc_or_a_broken_reference_fails_the_build(tmp_path):
    book = tmp_path / "book"
    shutil.copytree(BOOK, book, symlinks=False, ignore=shutil.ignore_patterns("_build", "chapters"))
    (book / "chapters").mkdir()
    for name in (*CHAPTERS, "10_not_in_the_toc"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
            f"[colab](https://colab.research.google.com/github/o/r/blob/main/notebooks/{name}.ipynb)\n# {name}")])
        nbformat.write(nb, book / "chapters" / f"{name}.ipynb")
    (book / "glossary.md").write_text("# Glossary\n\nSee {ref}`a-label-that-does-not-exist`.\n")
    # The book's extensions import tools.results from the repository root, which the copy is not in.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(book / "build.py")], capture_output=True, text=True, timeout=300,
                         env=env)
    log = run.stdout + run.stderr
    assert run.returncode != 0
    assert "10_not_in_the_toc" in log and "toctree" in log
    assert "a-label-that-does-not-exist" in log
