"""The landing page's course map: exercises and times read from the chapters, 'checked against' from book/index.md,
the same rows in the README; one Sphinx build of a two-chapter scratch book (a few seconds)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT / "book" / "_ext"
sys.path.insert(0, str(EXT))

import course_map  # noqa: E402

CHAPTERS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
CHECK_CALL = re.compile(r"^[^#\n]*?\bchecks\.(\w+)\(", re.M)


def chapter_notebook(path, *markdown):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(m) for m in markdown])
    nb.cells.append(nbformat.v4.new_code_cell("x = 1"))
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    nbformat.write(nb, path)
    return path


def test_exercises_minutes_and_reading_time_come_from_the_notebook(tmp_path):
    path = chapter_notebook(
        tmp_path / "03_x.ipynb", "# 03 · X\n\n" + "word " * 500,
        "### Exercise 3.1: MLP (★☆☆, ~10 min)\n\nWrite it.",
        "### Exercise 3.2 (optional): LayerNorm (★☆☆, ~10 min)\n<img src=\"data:image/png;base64,AAAA\">",
        "<!-- diagram: pre_post_norm -->\n![x](attachment:a.png)\n### Exercise 3.3: `EncoderBlock` (★★☆, ~20 min)")
    assert course_map.exercises(path) == [("3.1", "MLP", False, 10), ("3.2", "LayerNorm", True, 10),
                                          ("3.3", "EncoderBlock", False, 20)]
    plan = course_map.chapter_plan(path, run_minutes=3)
    assert (plan["required"], plan["optional"], plan["run"]) == (30, 10, 3)
    assert 5 <= plan["reading"] <= 6  # 500 words and the headings' few; images, comments and tags not counted
    assert plan["minutes"] == 40  # 5 reading + 30 + 3, to the nearest 5
    assert course_map.time_cell(plan) == "~40 min (+10 optional)"
    assert course_map.you_write(plan["exercises"]) == "`MLP`, `LayerNorm` (optional), `EncoderBlock`"
    longer = {**plan, "minutes": 90, "optional": 0}
    assert course_map.total_cell([plan, longer]) == "about 2 hours (130 min, +10 optional)"


@pytest.mark.parametrize("line", ["1 | x", "01 | x | soon", "01 | x | 1 | 2", "ab | x"])
def test_a_malformed_plan_line_is_an_error(line):
    with pytest.raises(ValueError, match="course-plan"):
        course_map.parse_plan([line])


def test_every_chapter_has_exercises_each_with_its_check_cell():
    """The map and `grade` read a chapter's exercises from its headings: each heading names a checked exercise."""
    assert len(CHAPTERS) == 9
    for path in CHAPTERS:
        found = course_map.exercises(path)
        assert found, f"{path.name}: no '### Exercise N.k: name (★☆☆, ~N min)' heading"
        assert [number.split(".")[0] for number, *_ in found] == [str(int(path.name[:2]))] * len(found), path.name
        nb = nbformat.read(path, as_version=4)
        checked = {name for cell in nb.cells if cell.cell_type == "code" for name in CHECK_CALL.findall(cell.source)}
        assert {name for _, name, _, _ in found} <= checked, f"{path.name}: a heading names no check cell's exercise"


def test_the_landing_page_has_a_plan_line_for_every_chapter_and_the_diagram_marker():
    text = (ROOT / "book" / "index.md").read_text()
    assert sorted(course_map.plan_of_index(text)) == [path.name[:2] for path in CHAPTERS]
    lines = text.splitlines()
    marker = lines.index("<!-- diagram: vit_overview -->")
    assert marker < lines.index("## The course map")


def test_the_landing_page_speaks_of_the_gpu_once_and_grades_for_learners():
    text = (ROOT / "book" / "index.md").read_text()
    assert "You do not need a GPU" not in text and "Chapters 1 to 5 need no GPU" in text
    assert "python -m vit_course grade notebooks/" in text and "skipped" in text
    assert "nbval" not in text and "Cell n-1" not in text  # contributors' matters are in CONTRIBUTING.md


def test_the_readme_course_table_is_written_from_the_chapters():
    from tools import course_map as tool

    assert tool.main(["--check"]) == 0, "run `python -m tools.course_map`"


def test_the_built_table_lists_each_chapters_exercises_and_the_total(tmp_path):
    book = tmp_path / "book"
    (book / "chapters").mkdir(parents=True)
    chapter_notebook(book / "chapters" / "01_a.ipynb", "# 01 · Alpha\n\n## Part\n\n" + "word " * 1000,
                     "### Exercise 1.1: attend (★★☆, ~15 min)")
    chapter_notebook(book / "chapters" / "02_b.ipynb", "# 02 · Beta\n\n## Part\n\n" + "word " * 200,
                     "### Exercise 2.1: split (★☆☆, ~5 min)", "### Exercise 2.2 (optional): merge (★☆☆, ~5 min)")
    (book / "index.md").write_text("# Scratch\n\n```{course-plan}\n01 | PyTorch's `F.sdpa`\n02 | `nn.MHA` | 3\n```"
                                   "\n\n```{toctree}\nchapters/01_a\nchapters/02_b\n```\n")
    (book / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(EXT)!r})\n"
                                  "extensions = ['myst_nb', 'course_map']\nnb_execution_mode = 'off'\n"
                                  "exclude_patterns = ['_build']\nhtml_theme = 'basic'\n")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", str(book),
                          str(book / "_build")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (book / "_build" / "index.html").read_text()))
    assert re.search("01 Alpha attend PyTorch[’']s F.sdpa ~25 min", page), page
    assert "02 Beta split , merge (optional) nn.MHA ~10 min (+5 optional)" in page
    assert "Total about 35 min (+5 optional)" in page
    shutil.rmtree(book / "_build")
