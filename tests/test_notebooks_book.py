"""What the generated notebooks look like in the book: the setup cell folded, and Colab/Binder links that follow
VIT_COURSE_REPO at build time. A few seconds: one Sphinx build of a one-chapter scratch book, not the course's."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools import notebooks
from vit_course import files

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT / "book" / "_ext"
sys.path.insert(0, str(EXT))

import course_links  # noqa: E402
from course_chapters import label_setup  # noqa: E402

FORK = "git+https://github.com/a-fork/vit-course-fork@spring-2027"


def chapter(name="01_test"):
    """A generated solution notebook: badge, setup cell (with its stored output), one more cell."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 01 · Test\n\nThe story starts here.")])
    nb.cells.append(nbformat.v4.new_code_cell("x = 1 + 1\nprint(x)", outputs=[
        nbformat.v4.new_output("stream", text="2\n")]))
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    notebooks.refresh_solution(nb, name)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="Using device: cpu\n")]
    return nb


# ---- the setup cell -----------------------------------------------------------------------------------------

def test_setup_cell_is_tagged_hide_cell_unless_an_author_hid_it_otherwise():
    nb = chapter()
    assert nb.cells[1].metadata["tags"] == ["setup", "hide-cell"]
    nb.cells[1].metadata["tags"] = ["setup"]  # a notebook from before the tag: refreshed once
    assert notebooks.refresh_solution(nb, "01_test") and nb.cells[1].metadata["tags"] == ["setup", "hide-cell"]
    assert not notebooks.refresh_solution(nb, "01_test")
    nb.cells[1].metadata["tags"] = ["setup", "hide-input"]  # the author's own choice is kept
    assert not notebooks.refresh_solution(nb, "01_test") and nb.cells[1].metadata["tags"] == ["setup", "hide-input"]
    student = notebooks.student_version(chapter())
    assert student.cells[1].metadata == {"tags": ["setup", "hide-cell"]}  # harmless in Jupyter and Colab


@pytest.mark.repo_text
def test_every_chapter_setup_cell_is_folded():
    paths = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    assert paths
    for path in paths:
        setup = nbformat.read(path, as_version=4).cells[1]
        assert setup.cell_type == "code" and setup.metadata.get("tags") == ["setup", "hide-cell"], path.name


def test_label_setup_names_the_toggle_of_a_folded_setup_cell_only():
    nb = json.loads(notebooks.dumps(chapter()))
    assert label_setup(nb) == 1
    assert nb["cells"][1]["metadata"]["mystnb"]["code_prompt_show"].startswith("Show the setup")
    nb["cells"][1]["metadata"]["tags"] = ["setup"]
    del nb["cells"][1]["metadata"]["mystnb"]
    assert label_setup(nb) == 0 and "mystnb" not in nb["cells"][1]["metadata"]


@pytest.mark.repo_text
def test_notebooks_write_through_the_package_atomic_writer():
    assert not hasattr(notebooks, "write_atomic") and notebooks.write_text is files.write_text


# ---- the Colab and Binder links -----------------------------------------------------------------------------

@pytest.mark.parametrize("source, target", [
    (f"git+{notebooks.REPO_URL}@{notebooks.BRANCH}", ("vit-course/vit-from-scratch", "main")),  # the default
    (FORK, ("a-fork/vit-course-fork", "spring-2027")),
    ("git+https://github.com/a-fork/vit.course.git@v1.2", ("a-fork/vit.course", "v1.2")),
    ("git+ssh://git@github.com/a-fork/fork.git", ("a-fork/fork", None)),
    ("https://github.com/a-fork/fork/", ("a-fork/fork", None)),
    ("git+https://github.com/a-fork/fork@main#egg=vit-course", ("a-fork/fork", "main")),
])
def test_github_target_of_a_pip_source(source, target):
    assert course_links.github_target(source) == target


@pytest.mark.parametrize("source", ["git+file://localhost/tmp/clone", "/tmp/clone", "vit-course==0.1",
                                    "git+https://gitlab.com/a/b@main", "https://github.com/only-owner"])
def test_a_source_that_is_not_on_github_is_an_error(source):
    with pytest.raises(ValueError, match="VIT_COURSE_REPO=.*names no GitHub repository"):
        course_links.github_target(source)


def test_point_links_moves_colab_links_and_keeps_the_rest():
    text = notebooks.dumps(chapter())
    assert course_links.point_links(text, "") == text and course_links.point_links(text, "  ") == text
    moved = course_links.point_links(text, FORK)
    fork_link = "https://colab.research.google.com/github/a-fork/vit-course-fork/blob/spring-2027/notebooks/01_test.ipynb"
    assert fork_link in moved and "colab.research.google.com/github/vit-course" not in moved
    assert notebooks.REPO_URL in moved  # the setup cell's install default is the notebook's, not the book's
    no_ref = course_links.point_links(text, "git+https://github.com/a-fork/f")
    assert "github/a-fork/f/blob/main/notebooks/01_test.ipynb" in no_ref  # the notebook's branch stays


def scratch_book(tmp_path):
    """A one-chapter book with the course's extension, laid out like the repository (book/, notebooks/)."""
    book = tmp_path / "book"
    (book / "chapters").mkdir(parents=True)
    (book / "_static").mkdir()
    shutil.copy(ROOT / "book" / "_static" / "colab-badge.svg", book / "_static")
    solution = chapter()
    nbformat.write(solution, book / "chapters" / "01_test.ipynb")
    (tmp_path / "notebooks").mkdir()
    nbformat.write(notebooks.student_version(solution), tmp_path / "notebooks" / "01_test.ipynb")
    (book / "index.md").write_text("# Scratch\n\n```{course-map}\n```\n\n```{toctree}\nchapters/01_test\n```\n")
    (book / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(EXT)!r})\n"
                                  "extensions = ['myst_nb', 'course_book']\nnb_execution_mode = 'off'\n"
                                  "exclude_patterns = ['_build']\nhtml_theme = 'basic'\n")
    return book


def test_built_book_links_follow_vit_course_repo(tmp_path):
    book = scratch_book(tmp_path)
    env = {**os.environ, "VIT_COURSE_REPO": FORK}
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", str(book),
                          str(book / "_build")], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    page = (book / "_build" / "chapters" / "01_test.html").read_text()
    colab = "https://colab.research.google.com/github/a-fork/vit-course-fork/blob/spring-2027/notebooks/01_test.ipynb"
    assert colab in page and "github/vit-course/vit-from-scratch" not in page
    index = (book / "_build" / "index.html").read_text()
    binder = "https://mybinder.org/v2/gh/a-fork/vit-course-fork/spring-2027?urlpath=lab/tree/notebooks/01_test.ipynb"
    assert colab in index and binder in index
    # the setup cell: folded, input and output, behind its own toggle, before the story's next cell
    setup = page.index('<div class="cell tag_setup tag_hide-cell')
    details = re.compile(r'<details class="[^"]*\bhide above-input">').search(page, setup).start()
    end = page.index("</details>", details)
    assert details - setup < 80 and details < page.index("Show the setup", details) < end
    assert details < page.index("# Setup: on Colab") < page.index("Using device: cpu") < end  # input and output
    assert page.index("The story starts here") < setup and end < page.index('<span class="n">x</span>')

    env["VIT_COURSE_REPO"] = "git+file://localhost/tmp/clone"  # a local clone: no Colab link can open it
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", str(book), str(book / "_build")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode != 0 and "names no GitHub repository" in run.stderr, run.stderr


@pytest.mark.repo_text
def test_the_introductions_clone_command_names_the_notebooks_repository():
    """book/index.md's `git clone` is the one place besides tools/notebooks.py that names the repository: a fork
    that changes REPO_URL is told to change it too."""
    clones = re.findall(r"git clone (\S+)", (ROOT / "book" / "index.md").read_text())
    assert clones == [notebooks.REPO_URL], f"book/index.md clones {clones}, tools/notebooks.py has {notebooks.REPO_URL}"
