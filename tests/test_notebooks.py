"""The student-notebook generator, and the notebooks it makes: in sync, stopping at the first check when
untouched, passing with the solutions pasted back, and holding the same code as vit_course."""

import ast
import copy
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

import vit_course
from tools import notebooks
from vit_course import files, kernel

from .markers import data_or_skip, skip_without_data

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
STUDENTS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHECK_CELL = re.compile(r"^\s*checks\.\w+\(", re.M)

EXERCISE = '''import torch


def double(x):
    """(n,) -> (n,)"""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION


class Scale(torch.nn.Module):
    def __init__(self, factor):
        super().__init__()
        ### BEGIN SOLUTION
        self.factor = factor
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN HINT
        # multiply by the factor
        use self.factor
        ### END HINT
        ### BEGIN SOLUTION
        return self.factor * x
        ### END SOLUTION
'''


def synthetic(exercise=EXERCISE, check="assert double(torch.ones(2)).tolist() == [2.0, 2.0]"):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python", "version": "3.11.4"}}
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · Test\n\nSome words.", id="title"),
                nbformat.v4.new_code_cell(exercise, id="exercise", execution_count=3, metadata={"scrolled": True}),
                nbformat.v4.new_code_cell(check, id="check", metadata={"tags": ["check"]},
                                          outputs=[nbformat.v4.new_output("stream", text="ok\n")])]
    notebooks.refresh_solution(nb, "99_test")
    return nb


def test_student_version_replaces_solutions_keeps_hints_and_indentation():
    student = notebooks.student_version(synthetic())
    source = student.cells[2].source
    assert '    # YOUR CODE HERE\n    raise NotImplementedError("double")' in source
    assert '        # YOUR CODE HERE\n        raise NotImplementedError("Scale")' in source
    assert "2 * x" not in source and "self.factor = factor" not in source and "SOLUTION" not in source
    assert "        # multiply by the factor\n        # use self.factor\n" in source and "HINT" not in source
    assert '"""(n,) -> (n,)"""' in source  # signature and docstring stay for the student
    compile(source, "student", "exec")


def test_student_version_clears_outputs_and_volatile_metadata():
    solution = synthetic()
    before = notebooks.dumps(solution)
    student = notebooks.student_version(solution)
    assert notebooks.dumps(solution) == before  # the solution is left alone
    for cell in student.cells:
        assert cell.cell_type == "markdown" or (cell.outputs == [] and cell.execution_count is None)
    assert student.cells[2].metadata == {} and student.cells[3].metadata == {"tags": ["check"]}
    assert student.metadata == {"kernelspec": solution.metadata.kernelspec, "language_info": {"name": "python"}}


def test_badge_and_setup_cell_come_from_one_setting():
    nb = synthetic()
    assert nb.cells[0].source.startswith(
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google"
        ".com/github/vit-course/vit-from-scratch/blob/main/notebooks/99_test.ipynb)\n\n# 99 · Test")
    setup = nb.cells[1]
    assert setup.metadata["tags"] == ["setup", "hide-cell"] and notebooks.REPO_URL in setup.source  # folded in the book
    assert 'os.environ.get("VIT_COURSE_REPO"' in setup.source and "sys.executable" in setup.source
    assert "!" not in setup.source and 'print("Using device:", device.type)' in setup.source
    compile(setup.source, "setup", "exec")
    setup.outputs = [nbformat.v4.new_output("stream", text="Using device: cpu\n")]
    setup.source = setup.source.replace("vit-from-scratch", "old-name")
    nb.cells[0].source = nb.cells[0].source.replace("99_test", "00_old")
    assert notebooks.refresh_solution(nb, "99_test")  # a stale badge/setup is rewritten ...
    assert "old" not in nb.cells[0].source + nb.cells[1].source and nb.cells[1].outputs[0].text == "Using device: cpu\n"
    assert not notebooks.refresh_solution(nb, "99_test") and len(nb.cells) == 5  # ... once, outputs kept
    assert nb.cells[-1].metadata["tags"] == ["grading"] and "grade notebooks/99_test.ipynb" in nb.cells[-1].source


@pytest.mark.parametrize("source, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "never closed"),
    ("def f():\n    return 1\n    ### END SOLUTION\n", "without BEGIN"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "needs a name"),
])
def test_unbalanced_markers_are_errors(source, message):
    with pytest.raises(ValueError, match=message):
        notebooks.strip_solutions(source)


def test_named_region_outside_a_def():
    source, names = notebooks.strip_solutions("### BEGIN SOLUTION pool_tokens\nx = 1\n### END SOLUTION")
    assert names == ["pool_tokens"] and source == '# YOUR CODE HERE\nraise NotImplementedError("pool_tokens")'


def test_generate_is_deterministic_atomic_and_checkable(tmp_path, monkeypatch):
    (tmp_path / "solutions").mkdir()
    raw = synthetic()
    raw.cells = [raw.cells[0], *raw.cells[2:]]  # no setup cell yet, an old badge-less title
    raw.cells[0].source = "# 99 · Test"
    nbformat.write(raw, tmp_path / "solutions" / "99_test.ipynb")
    assert notebooks.main(["--root", str(tmp_path), "--check"]) == 1
    assert notebooks.main(["--root", str(tmp_path)]) == 0
    student = tmp_path / "notebooks" / "99_test.ipynb"
    first = student.read_bytes()
    assert notebooks.generate(tmp_path) == [] and student.read_bytes() == first  # run twice: no diff
    assert notebooks.main(["--root", str(tmp_path), "--check"]) == 0
    solution = nbformat.read(tmp_path / "solutions" / "99_test.ipynb", as_version=4)
    assert solution.cells[1].metadata["tags"] == ["setup", "hide-cell"] and "Open In Colab" in solution.cells[0].source

    (tmp_path / "notebooks" / "98_orphan.ipynb").write_text(first.decode())
    assert notebooks.main(["--root", str(tmp_path), "--check"]) == 1  # a student notebook without solution
    (tmp_path / "notebooks" / "98_orphan.ipynb").unlink()

    def crash(src, dst):
        raise OSError("disk full")

    solution.cells[2].source += "\n# changed"
    nbformat.write(solution, tmp_path / "solutions" / "99_test.ipynb")
    monkeypatch.setattr(files.os, "replace", crash)  # the one atomic writer, which notebooks use
    with pytest.raises(OSError):
        notebooks.generate(tmp_path)
    assert student.read_bytes() == first and sorted(p.name for p in student.parent.iterdir()) == ["99_test.ipynb"]


# --- self-grading with nbval ---------------------------------------------------------------------------------

GRADED = '''def split_heads(x, num_heads):
    """(b, n, D) -> (b, h, n, d)"""
    ### BEGIN SOLUTION
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)
    ### END SOLUTION
'''


def test_nbval_lax_passes_exactly_when_the_checks_pass(tmp_path):
    """`pytest --nbval-lax` on a student notebook: fails untouched and with a wrong answer, passes when solved."""
    solution = synthetic(GRADED, "checks.split_heads(split_heads)")
    student = notebooks.student_version(solution)
    wrong = copy.deepcopy(student)
    no_transpose = "x.reshape(len(x), num_heads, x.shape[1], -1)"  # the classic mistake: no transpose
    wrong.cells[2].source = GRADED.replace("x.unflatten(-1, (num_heads, -1)).transpose(1, 2)", no_transpose)
    solved = copy.deepcopy(student)
    solved.cells[2].source = GRADED
    for name, nb in (("untouched", student), ("wrong", wrong), ("solved", solved)):
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q", "-rf",
                          "untouched.ipynb", "wrong.ipynb", "solved.ipynb"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env=this_package())
    failed = set(re.findall(r"^FAILED (\w+)\.ipynb::", run.stdout, re.M))
    assert failed == {"untouched", "wrong"}, run.stdout[-3000:]
    assert "CheckFailed\x1b[0m: not done yet: split_heads" in run.stdout  # the message alone, no traceback
    assert "without a transpose" in run.stdout  # the likely cause (checks/ch02_multi_head_attention.py)
    assert "Traceback (most recent call last)" not in run.stdout and "site-packages" not in run.stdout


# --- the course's own notebooks ------------------------------------------------------------------------------

def this_package(env=None):
    """The environment for a kernel that imports this checkout's vit_course, whatever else is installed."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run_cells(nb, cells, cwd):
    """Execute only ``cells`` of nb (in order) with nbclient; returns the executed notebook."""
    from nbclient import NotebookClient

    part = copy.deepcopy(nb)
    part.cells = [part.cells[i] for i in cells]
    client = NotebookClient(part, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute(env=this_package())
    return part


def check_cells(nb):
    return [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and CHECK_CELL.search(cell.source)]


def test_student_notebooks_are_in_sync():
    if not SOLUTIONS:
        pytest.skip("solutions/ is still empty")
    stale = notebooks.generate(ROOT, check=True, log=lambda _: None)
    assert not stale, f"out of date (run `python -m tools.notebooks`): {[str(p) for p in stale]}"


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_a_student_notebook_links_only_to_the_web_and_ends_saying_how_to_grade_it(path):
    """Opened on Colab or a laptop, a student notebook has no repository beside it: every markdown link is absolute
    (the book's pages) or to a place on the page; its last cell grades this very notebook, locally and on Colab."""
    nb = nbformat.read(path, as_version=4)
    links = [link for cell in nb.cells if cell.cell_type == "markdown"
             for link in re.findall(r"\]\(([^)\s]+)", cell.source)]
    relative = [link for link in links if not link.startswith(("https://", "http://", "#"))]
    assert not relative, f"{path.name} links to paths that exist only in the repository: {relative}"
    last = nb.cells[-1].source
    assert f"vit_course grade notebooks/{path.name}" in last and f"/{path.name}" in last.split("Colab", 1)[1]


def test_book_links_become_the_published_pages():
    source = "See [the appendix](../book/recipes.md#crop) and [results](../book/results.md), [PyTorch](https://x.y)."
    assert notebooks.absolute_links(source) == (f"See [the appendix]({notebooks.BOOK_URL}/recipes.html#crop) and "
                                                f"[results]({notebooks.BOOK_URL}/results.html), [PyTorch](https://x.y).")


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_untouched_student_notebook_stops_at_first_check(path):
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    cells = check_cells(nb)
    if not cells:
        pytest.skip("no check cell")
    first = cells[0]
    with pytest.raises(CellExecutionError) as info:
        run_cells(nb, [i for i in range(first + 1) if "slow" not in nb.cells[i].metadata.get("tags", [])], path.parent)
    error = info.value
    skip_without_data(error)  # a chapter that loads MNIST or CIFAR-10 before its first check, offline
    assert error.ename == "CheckFailed" and "not done yet" in error.evalue, str(error)[-2000:]
    assert "\n" not in error.evalue.strip(), f"not the course's one-line message: {error.evalue!r}"
    assert "Traceback" not in str(error) and "site-packages" not in str(error), str(error)[-2000:]
    assert CHECK_CELL.search(error.args[0] if error.args else ""), "stopped before the first check cell"
    name = re.search(r"checks\.(\w+)\(", nb.cells[first].source).group(1)  # the first exercise
    assert error.evalue.startswith(f"not done yet: {name}"), error.evalue


def fill_in(student_source, solution_source):
    """Paste the solution regions back into a student cell, in order."""
    regions, region = [], None
    for line in solution_source.split("\n"):
        if notebooks.BEGIN.match(line):
            region = []
        elif notebooks.END.match(line):
            regions.append(region)
            region = None
        elif region is not None:
            region.append(line)
    out, lines, i = [], student_source.split("\n"), 0
    while i < len(lines):
        if lines[i].strip() == "# YOUR CODE HERE" and "raise NotImplementedError" in lines[i + 1]:
            out += regions.pop(0)
            i += 2
        else:
            out.append(lines[i])
            i += 1
    assert not regions, "more solution regions than stubs: notebooks/ is stale, run `python -m tools.notebooks`"
    return "\n".join(out)


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_student_notebook_with_solutions_pasted_back_passes(path):
    student = nbformat.read(path, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / path.name, as_version=4)
    for cell, solved in zip(student.cells, solution.cells, strict=True):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in solved.source:
            cell.source = fill_in(cell.source, solved.source)
    cells = check_cells(student)
    if not cells:
        pytest.skip("no check cell")
    keep = [i for i in range(cells[-1] + 1) if "slow" not in student.cells[i].metadata.get("tags", [])]
    with data_or_skip():
        done = run_cells(student, keep, path.parent)
    printed = "".join(o.get("text", "") for i in cells for o in done.cells[keep.index(i)].outputs)
    assert printed.count("✔") == len(cells), printed


def _definition(source, name):
    """The def/class ``name`` in source, without docstrings, comments or formatting."""
    tree = ast.parse(textwrap.dedent(source))
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
    if node is None:
        return None
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if (isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            sub.body = body[1:] or [ast.Pass()]
    return ast.unparse(node)


def _reference(name):
    for module in ("vit_course", "vit_course.train", "vit_course.data", "vit_course.interpret"):
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    return None


EXERCISES = [(path, name, source) for path in SOLUTIONS
             for _, name, source in notebooks.exercises(nbformat.read(path, as_version=4))]


@pytest.mark.parametrize("path, name, source", EXERCISES, ids=[f"{p.stem}-{n}" for p, n, _ in EXERCISES])
def test_solution_cell_equals_the_reference(path, name, source):
    """The reference lives once, in vit_course: the solution notebook's exercise code must be the same code."""
    reference = _reference(name)
    assert reference is not None, f"{name} (in {path.name}) has no reference in vit_course"
    ours = _definition(source, name)
    assert ours is not None, f"{path.name}: the exercise cell does not define {name} at top level"
    theirs = _definition(inspect.getsource(reference), name)
    assert ours == theirs, f"{path.name}: {name} differs from {inspect.getsourcefile(reference)}"


def test_vit_course_exports_the_generator():
    assert callable(notebooks.main) and vit_course.checks.CheckFailed.__mro__[1] is AssertionError
    assert json.loads(notebooks.dumps(synthetic()))["nbformat"] == 4


def test_drift_comparison_ignores_docstrings_and_comments_only():
    reference = _definition(inspect.getsource(vit_course.split_heads), "split_heads")
    same = '''def split_heads(x, num_heads):
    ### BEGIN SOLUTION
    if x.shape[-1] % num_heads:  # a comment
        raise ValueError(f"width {x.shape[-1]} is not divisible by num_heads={num_heads}")
    return rearrange(x, "... n (h d) -> ... h n d",
                     h=num_heads)
    ### END SOLUTION
'''
    assert _definition(same, "split_heads") == reference
    assert _definition(same.replace("h n d", "n h d"), "split_heads") != reference


def test_executing_drops_side_widgets_and_keeps_a_widget_result(tmp_path):
    """Progress bars (displayed widgets) would store state nobody can replay; an explorer that is the cell's
    result keeps its output, as nbval compares it."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import ipywidgets\nfrom IPython.display import display\ndisplay(ipywidgets.IntSlider())\n"
        "print('beside')\nipywidgets.Button(description='result')")])
    (cell,) = kernel.run(nb, tmp_path).cells
    kinds = [(o["output_type"], kernel.WIDGET in o.get("data", {})) for o in cell.outputs]
    assert kinds == [("stream", False), ("execute_result", True)], kinds
    assert "result" in cell.outputs[1]["data"]["text/plain"]


def test_merge_streams_joins_consecutive_prints_to_one_stream_only():
    """However the kernel flushed them, consecutive prints to one stream are stored as one output; a different
    stream or another output between them keeps them apart."""
    out = lambda text, name="stdout": {"output_type": "stream", "name": name, "text": text}  # noqa: E731
    image = {"output_type": "display_data", "data": {"image/png": "..."}}
    outputs = [out("a\n"), out(["b\n", "c\n"]), out("!\n", "stderr"), out("d\n"), image, out("e\n")]
    assert kernel.merge_streams(outputs) == [out("a\nb\nc\n"), out("!\n", "stderr"), out("d\n"), image, out("e\n")]
    assert kernel.merge_streams([]) == []
