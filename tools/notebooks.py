"""Student notebooks from one source (every chapter): ``solutions/NN_name.ipynb`` -> ``notebooks/NN_name.ipynb``.
Repository tooling for the course's maintainers, not installed with the package (``vit_course``).

In a solution code cell, the exercise body sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
(nbgrader's markers; ``### BEGIN SOLUTION name`` names the exercise, otherwise it is the enclosing
top-level def or class). The student copy gets ``# YOUR CODE HERE`` and ``raise NotImplementedError(
"name")`` instead, at the same indentation; ``### BEGIN HINT`` ... ``### END HINT`` lines stay, as
comments. Outputs, execution counts and volatile metadata are cleared, so the result is deterministic.

The repository URL and branch live here and nowhere else: every solution's first markdown cell gets the
Colab badge of its student notebook and its second cell the setup cell below (outputs kept), tagged
``hide-cell``: the book folds it, so each chapter opens with its story. Writes are atomic (``files.py``).

    python -m tools.notebooks            # refresh badges/setup cells, write notebooks/
    python -m tools.notebooks --check    # exit 1 if notebooks/ (or a badge/setup cell) is stale
    python -m tools.notebooks --execute [solutions/NN_name.ipynb ...]  # re-run solutions, then write
"""

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from vit_course.files import write_text
from vit_course.kernel import ROOT, TIMEOUT, run

REPO_URL = "https://github.com/vit-course/vit-from-scratch"  # a fork changes this line (README: publishing)
BRANCH = "main"
# Where the built book (`make book`: book/_build/html) is served: GitHub Pages of REPO_URL, published by
# .github/workflows/book.yml on every push to main. None: derived from REPO_URL, https://OWNER.github.io/REPO;
# set a URL here for a custom domain. A student notebook opens on Colab or a laptop, without the repository beside
# it: its links to the book's pages point here.
BOOK_URL_OVERRIDE = None


def pages_url(repo_url):
    """GitHub Pages' address of a repository: https://github.com/OWNER/REPO -> https://owner.github.io/REPO."""
    owner, repo = repo_url.removeprefix("https://github.com/").removesuffix(".git").strip("/").split("/")
    site = f"{owner.lower()}.github.io"
    return f"https://{site}" if repo.lower() == site else f"https://{site}/{repo}"  # a user site: at the root


BOOK_URL = BOOK_URL_OVERRIDE or pages_url(REPO_URL)
BOOK_LINK = re.compile(r"\]\(\.\./book/([\w/-]+)\.md(#[\w-]*)?\)")  # ](../book/recipes.md#anchor)

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BEGIN, END = re.compile(r"^(\s*)### BEGIN SOLUTION\b\s*(\w*)"), re.compile(r"^\s*### END SOLUTION\b")
BEGIN_HINT, END_HINT = re.compile(r"^(\s*)### BEGIN HINT\b"), re.compile(r"^\s*### END HINT\b")
TOP_LEVEL = re.compile(r"^(?:async\s+def|def|class)\s+(\w+)")
HIDING_TAGS = {"hide-cell", "hide-input", "remove-cell", "remove-input"}  # Jupyter Book's; the setup cell: hide-cell


def colab_badge(name):
    """The markdown badge opening the student notebook ``name`` (e.g. "01_self_attention") in Colab."""
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    url = f"https://colab.research.google.com/github/{owner_repo}/blob/{BRANCH}/notebooks/{name}.ipynb"
    return f"[![Open In Colab]({BADGE_IMAGE})]({url})"


def setup_source():
    """The setup cell: on Colab install the package from the repository; everywhere seed and pick the device."""
    return f'''# Setup: on Colab, install the course package; everywhere, seed torch and pick the device.
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    repo = os.environ.get("VIT_COURSE_REPO", "git+{REPO_URL}@{BRANCH}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", f"vit-course @ {{repo}}"], check=True)

import torch

import vit_course
from vit_course import checks

torch.manual_seed(0)
device = vit_course.pick_device()
print("Using device:", device.type)'''


def grading_source(name):
    """The last cell of every chapter: how to grade the notebook, locally and on Colab."""
    return f'''**Grade your notebook.** `python -m vit_course grade notebooks/{name}.ipynb` runs it top to bottom in a
fresh kernel and prints ✔ or ✘ for each exercise, with the likely cause under a ✘. On Colab, save it first (*File > Save
a copy in Drive* puts it in Drive's *Colab Notebooks* folder), then run in a new cell at the end of the notebook:

```ipython3
from google.colab import drive
drive.mount("/content/drive")
!python -m vit_course grade "/content/drive/MyDrive/Colab Notebooks/Copy of {name}.ipynb"
```

Or, without Drive: *File > Download > Download .ipynb*, upload the file in the *Files* pane on the left, and grade
`/content/{name}.ipynb`. Grading stops after the last check cell, so the cell that grades is not run again.'''


def absolute_links(source):
    """A markdown cell's links to the book's pages (``../book/X.md``) as links to the published book."""
    return BOOK_LINK.sub(lambda m: f"]({BOOK_URL}/{m[1]}.html{m[2] or ''})", source)


def _enclosing_name(lines, index):
    for line in reversed(lines[:index]):
        match = TOP_LEVEL.match(line)
        if match:
            return match.group(1)
    return None


def strip_solutions(source, where="cell"):
    """A solution cell's source -> the student's: solution regions replaced, hints kept as comments.

    Returns (student source, list of exercise names). Raises ValueError on unbalanced markers.
    """
    lines, out, names = source.split("\n"), [], []
    region = hint = None  # (indent, name) of the open solution region; indent of the open hint
    for i, line in enumerate(lines):
        begin, begin_hint = BEGIN.match(line), BEGIN_HINT.match(line)
        if begin:
            if region:
                raise ValueError(f"{where}, line {i + 1}: BEGIN SOLUTION inside another solution region")
            name = begin.group(2) or _enclosing_name(lines, i)
            if not name:
                raise ValueError(f"{where}, line {i + 1}: a solution region outside any def or class needs a "
                                 f"name: '### BEGIN SOLUTION exercise_name'")
            region = (begin.group(1), name)
            names.append(name)
        elif END.match(line):
            if not region or hint is not None:
                raise ValueError(f"{where}, line {i + 1}: END SOLUTION without BEGIN SOLUTION (or inside a hint)")
            indent, name = region
            out += [f"{indent}# YOUR CODE HERE", f'{indent}raise NotImplementedError("{name}")']
            region = None
        elif begin_hint:
            if hint is not None:
                raise ValueError(f"{where}, line {i + 1}: BEGIN HINT inside another hint")
            hint = begin_hint.group(1)
        elif END_HINT.match(line):
            if hint is None:
                raise ValueError(f"{where}, line {i + 1}: END HINT without BEGIN HINT")
            hint = None
        elif hint is not None:  # hint text: kept for the student, as a comment
            text = line.strip()
            out.append(line if text.startswith("#") or not text else f"{hint}# {text}")
        elif not region:
            out.append(line)
    if region or hint is not None:
        raise ValueError(f"{where}: a BEGIN {'SOLUTION' if region else 'HINT'} marker is never closed")
    return "\n".join(out), names


def exercises(nb):
    """[(cell index, exercise name, cell source)] of a solution notebook's exercise cells."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            for name in dict.fromkeys(strip_solutions(cell.source, f"cell {index}")[1]):  # a class: one entry
                found.append((index, name, cell.source))
    return found


def _with_badge(source, name):
    badge = colab_badge(name)
    lines = source.split("\n")
    if lines and lines[0].startswith("[![Open In Colab]"):
        return "\n".join([badge] + lines[1:])
    return f"{badge}\n\n{source}"


def refresh_solution(nb, name):
    """Write the Colab badge, the setup cell and the closing grading note into a solution notebook; True if anything
    changed.

    A setup cell whose source is already current keeps everything; an updated one keeps its outputs
    (the badge and the install line do not change what the cell prints). The setup cell is tagged
    ``hide-cell`` (unless it has another of Jupyter Book's hiding tags): the book shows it folded.
    """
    changed = False
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        nb.cells.insert(0, nbformat.v4.new_markdown_cell("", id="title"))
    first = nb.cells[0]
    source = _with_badge(first.source, name)
    if source != first.source:
        first.source, changed = source, True
    setup = nb.cells[1] if len(nb.cells) > 1 else None
    if setup is None or setup.cell_type != "code" or "setup" not in setup.metadata.get("tags", []):
        setup = nbformat.v4.new_code_cell("", id="setup", metadata={"tags": ["setup"]})
        nb.cells.insert(1, setup)
        changed = True
    if not HIDING_TAGS & set(setup.metadata["tags"]):
        setup.metadata["tags"].append("hide-cell")
        changed = True
    if setup.source != setup_source():
        setup.source, changed = setup_source(), True
    last = nb.cells[-1]
    if "grading" not in last.get("metadata", {}).get("tags", []):
        last = nbformat.v4.new_markdown_cell("", id="grading", metadata={"tags": ["grading"]})
        nb.cells.append(last)
    if last.source != grading_source(name):
        last.source, changed = grading_source(name), True
    return changed


def student_version(nb, name="notebook"):
    """The student notebook of a (refreshed) solution notebook: a new object, the input is left alone."""
    student = copy.deepcopy(nb)
    for index, cell in enumerate(student.cells):
        cell.setdefault("id", f"cell-{index}")
        tags = cell.get("metadata", {}).get("tags", [])
        cell.metadata = {"tags": list(tags)} if tags else {}
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source, f"{name}, cell {index}")[0]
            cell.outputs, cell.execution_count = [], None
        else:  # opened on Colab or a laptop, without the repository's book/ beside it
            cell.source = absolute_links(cell.source)
    kernelspec = nb.metadata.get("kernelspec", {"display_name": "Python 3", "language": "python", "name": "python3"})
    student.metadata = {"kernelspec": dict(kernelspec), "language_info": {"name": "python"}}
    for key in ("accelerator", "colab"):  # Colab reads the GPU request (chapters that train) from these
        if key in nb.metadata:
            student.metadata[key] = nb.metadata[key]
    return student


def dumps(nb):
    """nbformat's JSON, with a final newline: the same notebook always gives the same bytes."""
    return nbformat.writes(nb) + "\n"


def execute(path, timeout=TIMEOUT):
    """Run a solution notebook top to bottom in place (cwd = its folder), in a fresh kernel (``kernel.run``)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    refresh_solution(nb, path.stem)
    write_text(path, dumps(run(nb, path.parent, timeout)))


def generate(root=ROOT, check=False, log=print):
    """Refresh the solutions' badge and setup cells and write every student notebook.

    With check=True nothing is written; returns the list of stale files (empty when all is current).
    """
    solutions, students = Path(root) / "solutions", Path(root) / "notebooks"
    stale = []
    expected = set()
    for path in sorted(solutions.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if refresh_solution(nb, path.stem):
            stale.append(path)
            if not check:
                write_text(path, dumps(nb))
        target = students / path.name
        expected.add(target.name)
        text = dumps(student_version(nb, path.name))
        if not target.exists() or target.read_text(encoding="utf-8") != text:  # unchanged: not rewritten
            stale.append(target)
            if not check:
                write_text(target, text)
    stale += [p for p in sorted(students.glob("*.ipynb")) if p.name not in expected]  # no solution behind it
    for path in stale:
        log(f"{'stale' if check else 'wrote'}: {path.relative_to(root) if path.is_relative_to(root) else path}")
    return stale


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if notebooks/ or a badge/setup cell is stale")
    parser.add_argument("--execute", nargs="*", metavar="NOTEBOOK",
                        help="re-execute these solution notebooks (default: all) in place, then regenerate")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.execute is not None:
        paths = [Path(p) for p in args.execute] or sorted((args.root / "solutions").glob("[0-9][0-9]_*.ipynb"))
        for path in paths:
            print(f"executing {path} ...", flush=True)
            execute(path)
    stale = generate(args.root, check=args.check)
    if args.check and stale:
        print("notebooks are out of date: run `python -m tools.notebooks`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
