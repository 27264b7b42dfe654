"""Grade a learner's notebook (all chapters): ``python -m vit_course grade NOTEBOOK``.

Runs the notebook top to bottom in a fresh kernel (going on after errors, stopping after its last check
cell) and prints one line per exercise check cell, ✔ or ✘ with the exercise's name, the cell's number and,
for a failure, the first line of what went wrong; then ``K of N exercises pass``. Exit code 0 when all pass.
The notebook file is left as it was.
"""

import argparse
import re
import sys
from pathlib import Path

import nbformat

from .kernel import TIMEOUT, run

CHECK_CALL = re.compile(r"^[^#\n]*?\bchecks\.(\w+)\(", re.M)  # a call outside a comment
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CELL_NUMBERS = ("cell N counts every cell of the notebook, markdown cells included, from 1 at the top (JupyterLab "
                "and Jupyter Notebook do not number cells; the execution count [n] is another number)")


def check_cells(nb):
    """[(cell index, exercise name)] of the code cells that call ``checks.<Name>(``."""
    found = []
    for index, cell in enumerate(nb.cells):
        match = CHECK_CALL.search(cell.source) if cell.cell_type == "code" else None
        if match:
            found.append((index, match.group(1)))
    return found


def first_line(text):
    lines = [line.strip() for line in ANSI.sub("", str(text)).strip().split("\n") if line.strip()]
    return lines[0] if lines else ""


def cell_error(cell):
    """(exception name, first line of its message) of a code cell's error output, or None."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", "Error"), first_line(output.get("evalue", ""))
    return None


def printed(cell):
    """Everything a code cell printed (streams and plain-text results)."""
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            texts.append(output.get("text", ""))
        elif "data" in output:
            texts.append(output["data"].get("text/plain", ""))
    return ANSI.sub("", "".join(texts))


def execute(nb, folder, timeout=TIMEOUT, kernel="python3"):
    """Run the notebook's cells in place in a fresh kernel, going on after errors (cwd = ``folder``).

    Returns None, or the first line of what stopped the run (a timeout, a dead kernel)."""
    try:
        run(nb, folder, timeout, kernel, allow_errors=True)
    except Exception as error:  # noqa: BLE001  (a timeout, a dead kernel: grade what ran)
        return f"{type(error).__name__}: {first_line(error)}"
    return None


def verdict(nb, index, name, since, stopped=None):
    """(passed, message) for the check cell ``index``; ``since``: the first cell of its exercise."""
    cell = nb.cells[index]
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return False, f"not run ({stopped})" if stopped else "not run"
    if f"✔ {name}:" in printed(cell):  # passed (even if later code in the cell failed)
        return True, ""
    error = cell_error(cell)
    if error is None:
        return False, f"the check printed no ✔ line (is checks.{name}(...) still called?)"
    ename, message = error
    if ename == "CheckFailed":
        return False, message.removeprefix(f"{name}: ")
    for before in range(since, index):  # an exercise cell that failed first explains the rest
        earlier = cell_error(nb.cells[before]) if nb.cells[before].cell_type == "code" else None
        if earlier:
            return False, f"cell {before + 1} raised {earlier[0]}: {earlier[1]}".rstrip(": ")
    return False, f"{ename}: {message}".rstrip(": ")


def grade(path, timeout=TIMEOUT, kernel="python3"):
    """Run the notebook at ``path`` and return [(exercise, cell number, passed, message)]."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    cells = check_cells(nb)
    if not cells:
        return []
    nb.cells = nb.cells[:cells[-1][0] + 1]  # nothing after the last check can change a verdict
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    stopped = execute(nb, path.parent, timeout, kernel)
    results, since = [], 0
    for index, name in cells:
        passed, message = verdict(nb, index, name, since, stopped)
        results.append((name, index + 1, passed, message))
        since = index + 1
    return results


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m vit_course grade", description="Run a notebook in a fresh kernel and say which exercises "
        "pass their checks: one line per check cell, ✔ or ✘, the exercise, 'cell N' and, for a failure, the first "
        "line of the problem; then 'K of N exercises pass'. Exit code 0 when all pass, 1 otherwise.",
        epilog=f"{CELL_NUMBERS[0].upper()}{CELL_NUMBERS[1:]}. The run goes on after errors and stops after the last "
               "check cell; the notebook file is not changed.")
    parser.add_argument("notebook", type=Path,
                        help="the notebook to grade, e.g. notebooks/02_multi_head_attention.ipynb")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds allowed per cell (default %(default)s)")
    parser.add_argument("--kernel", default="python3", help="the Jupyter kernel to run it in (default %(default)s)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.notebook.is_file():
        print(f"grade: no notebook at {args.notebook}", file=sys.stderr)
        return 2
    try:
        nb = nbformat.read(args.notebook, as_version=4)
    except Exception as error:  # noqa: BLE001  (not JSON, not a notebook)
        print(f"grade: cannot read {args.notebook} as a notebook: {first_line(error)}", file=sys.stderr)
        return 2
    if not check_cells(nb):
        print(f"grade: {args.notebook} has no check cell (a code cell calling checks.NAME(...))", file=sys.stderr)
        return 1
    print(f"grading {args.notebook}: running its cells in a fresh kernel ...", file=sys.stderr, flush=True)
    results = grade(args.notebook, args.timeout, args.kernel)
    for name, number, passed, message in results:
        print(f"{'✔' if passed else '✘'} {name} (cell {number})" + ("" if passed else f": {message}"))
    passing = sum(passed for _, _, passed, _ in results)
    print(f"{passing} of {len(results)} exercises pass")
    return 0 if passing == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
