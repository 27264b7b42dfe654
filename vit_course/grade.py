"""Grade a learner's notebook (all chapters): ``python -m vit_course grade NOTEBOOK``.

Runs the notebook top to bottom in a fresh kernel (going on after errors, stopping after its last check
cell) and prints one line per exercise check cell: ✔ or ✘, the exercise's number and name as its heading gives
them (``✔ Exercise 1.2 SelfAttention``; a check cell without a ``### Exercise N.k: name`` heading is named by the
cell's number as Jupyter shows it after "Restart kernel and run all", ``In [n]``). An optional exercise (headed
``### Exercise N.k (optional): name``) left as the chapter allows, its stub untouched or the course's version
imported in its place, is "skipped", not failed. Under a ✘ come what went wrong, what the check tried,
the likely cause and where in the learner's code, and, when the exercise's code calls an earlier exercise that
fails its own check, that the failure probably comes from there. Then ``K of N exercises pass`` (skipped ones
not counted). Exit code 0 when all pass or are skipped. The notebook file is left as it was.
"""

import argparse
import re
import sys
from pathlib import Path

import nbformat

from .kernel import TIMEOUT, run

CHECK_CALL = re.compile(r"^[^#\n]*?\bchecks\.(\w+)\(", re.M)  # a call outside a comment
OPTIONAL = re.compile(r"^###\s+Exercise\s+\d+\.\d+\s*\(optional\)\s*:\s*`?(\w+)", re.M)
HEADING = re.compile(r"^###\s+Exercise\s+(\d+\.\d+)\s*(?:\(optional\))?\s*:\s*`?(\w+)", re.M)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CELL_NUMBERS = ("In [n] is the number Jupyter shows beside a code cell once the notebook has run top to bottom in a "
                "fresh kernel (Kernel > Restart Kernel and Run All Cells), which is how grade runs it. pytest "
                "--nbval-lax calls the same cell 'Cell n-1': it counts the code cells from 0, markdown cells left "
                "out (an empty code cell is counted there but gets no In [n], so below one the two differ by one "
                "more). A check cell that never ran is shown by its place among the code cells, as pytest counts")


def check_cells(nb):
    """[(cell index, exercise name)] of the code cells that call ``checks.<Name>(``."""
    found = []
    for index, cell in enumerate(nb.cells):
        match = CHECK_CALL.search(cell.source) if cell.cell_type == "code" else None
        if match:
            found.append((index, match.group(1)))
    return found


def optional_exercises(nb):
    """Names of the exercises a notebook's headings mark optional: ``### Exercise 3.2 (optional): LayerNorm``."""
    return {name for cell in nb.cells if cell.cell_type == "markdown" for name in OPTIONAL.findall(cell.source)}


def exercise_numbers(nb):
    """{exercise name: its number} from the headings ``### Exercise 1.2: SelfAttention (...)``."""
    return {name: number for cell in nb.cells if cell.cell_type == "markdown"
            for number, name in HEADING.findall(cell.source)}


def title(name, where):
    """How a line names an exercise: ``Exercise 1.2 SelfAttention``, or ``name (In [n])`` without a heading."""
    return f"{where} {name}" if where.startswith("Exercise ") else f"{name} ({where})"


def imports_reference(nb, since, index, name):
    """True if the cells of exercise ``name`` import it from the course's package instead of defining it."""
    code = [cell.source for cell in nb.cells[since:index] if cell.cell_type == "code"]
    if any(re.search(rf"^(?:class|def)\s+{re.escape(name)}\b", source, re.M) for source in code):
        return False
    imported = re.compile(rf"^\s*(?:from\s+vit_course(?:\.\w+)*\s+import\s+[^#\n]*\b{re.escape(name)}\b"
                          rf"|{re.escape(name)}\s*=\s*vit_course(?:\.\w+)*\.{re.escape(name)}\b)", re.M)
    return any(imported.search(source) for source in code)


def skipped(nb, index, name, since, passed, message):
    """Why the optional exercise ``name`` (check cell ``index``) counts as skipped, or None if it does not: its
    stub is untouched (the check says "not done yet" about it), or the course's version was imported instead."""
    if not passed and message.startswith(f"not done yet: {name}."):
        return "its stub still raises NotImplementedError"
    error = cell_error(nb.cells[index])
    if not passed and error and error[0] == "NotImplementedError" and error[1] in ("", name):
        return "its stub still raises NotImplementedError"
    if imports_reference(nb, since, index, name):
        return f"the course's {name} is imported in its place"
    return None


def lines(text):
    """The non-empty lines of an output text, without colour codes."""
    return [line.rstrip() for line in ANSI.sub("", str(text)).strip().split("\n") if line.strip()]


def first_line(text):
    found = lines(text)
    return found[0].strip() if found else ""


def cell_error(cell):
    """(exception name, its message, without colour codes) of a code cell's error output, or None."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", "Error"), "\n".join(lines(output.get("evalue", "")))
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


def cell_number(nb, index):
    """How Jupyter numbers the code cell ``index`` after a run from the top: 'In [n]'; a cell that did not run:
    'code cell k', its place among the code cells counted from 0 (pytest --nbval-lax's 'Cell k')."""
    count = nb.cells[index].get("execution_count")
    if count is not None:
        return f"In [{count}]"
    return f"code cell {sum(c.cell_type == 'code' for c in nb.cells[:index])}"


def execute(nb, folder, timeout=TIMEOUT, kernel="python3"):
    """Run the notebook's cells in place in a fresh kernel, going on after errors (cwd = ``folder``).

    Returns None, or the first line of what stopped the run (a timeout, a dead kernel)."""
    try:
        run(nb, folder, timeout, kernel, allow_errors=True)
    except Exception as error:  # noqa: BLE001  (a timeout, a dead kernel: grade what ran)
        return f"{type(error).__name__}: {first_line(error)}"
    return None


def verdict(nb, index, name, since, stopped=None):
    """(passed, message) for the check cell ``index``; ``since``: the first cell of its exercise. The message's
    first line says what went wrong; the lines after it (the check's "tried", "likely cause", "at line") explain."""
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
            return False, f"{cell_number(nb, before)} raised {earlier[0]}: {earlier[1]}".rstrip(": ")
    return False, f"{ename}: {message}".rstrip(": ")


def exercise_code(nb, since, index, name):
    """The sources of the exercise's code cells before its check cell ``index``: those defining ``name`` (else the
    code cell just before the check)."""
    code = [cell.source for cell in nb.cells[since:index] if cell.cell_type == "code"]
    defining = [source for source in code if re.search(rf"^(?:class|def)\s+{re.escape(name)}\b", source, re.M)]
    return defining or code[-1:]


def uses(nb, since, index, name, other):
    """True if the code of exercise ``name`` (its cells among ``since`` .. ``index``) calls exercise ``other``."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(other)}\s*\(")
    return any(pattern.search(source) for source in exercise_code(nb, since, index, name))


def grade(path, timeout=TIMEOUT, kernel="python3"):
    """Run the notebook at ``path``; returns [(exercise, where, passed, message, earlier)]. ``where``: "Exercise
    N.k" from the exercise's heading, else the check cell's number ("In [n]"); ``passed``: True, False, or None for
    an optional exercise skipped (``message`` then says how); ``earlier``: the (exercise, where) of earlier
    failing, or skipped and still unwritten, exercises this exercise's code calls."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    cells = check_cells(nb)
    if not cells:
        return []
    optional, numbers = optional_exercises(nb), exercise_numbers(nb)
    nb.cells = nb.cells[:cells[-1][0] + 1]  # nothing after the last check can change a verdict
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    stopped = execute(nb, path.parent, timeout, kernel)
    results, since, failed = [], 0, []
    for index, name in cells:
        passed, message = verdict(nb, index, name, since, stopped)
        why = skipped(nb, index, name, since, passed, message) if name in optional else None
        earlier = [(other, number) for other, number in failed if other != name and uses(nb, since, index, name,
                                                                                            other)]
        if why:
            passed, message = None, f"skipped (optional): {why}"
        where = f"Exercise {numbers[name]}" if name in numbers else cell_number(nb, index)
        results.append((name, where, passed, message, earlier))
        if passed is False or (why and "NotImplementedError" in why):  # a stub left in place breaks its callers
            failed.append((name, where))
        since = index + 1
    return results


def report(results):
    """The lines grade prints for ``results``."""
    out, skipped_names = [], {result[0] for result in results if result[2] is None}
    for name, where, passed, message, earlier in results:
        if passed:
            out.append(f"✔ {title(name, where)}")
            continue
        if passed is None:
            out.append(f"– {title(name, where)}: {message}")
            continue
        head, *details = message.split("\n") or [""]
        out.append(f"✘ {title(name, where)}: {head.strip()}")
        out += [f"    {line.strip()}" for line in details if line.strip()]
        for other, at in earlier:
            if other in skipped_names:
                out.append(f"    probably caused by an optional exercise you skipped: this exercise's code calls your "
                           f"{other} ({at}), whose stub still raises; write it, or use the course's: "
                           f"`from vit_course import {other}`")
                continue
            out.append(f"    probably caused by an earlier exercise: your {other} ({at}) fails its check and "
                       f"this exercise's code calls it; fix {other} first")
    graded = [result for result in results if result[2] is not None]
    passing = sum(bool(result[2]) for result in graded)
    left = len(results) - len(graded)
    return out + [f"{passing} of {len(graded)} exercises pass" + (f"; {left} optional skipped" if left else "")]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m vit_course grade", description="Run a notebook in a fresh kernel and say which exercises "
        "pass their checks: one line per check cell, ✔ or ✘ (or skipped, for an optional exercise left as the chapter "
        "allows), and the exercise, by its number and name (Exercise 1.2 SelfAttention; without a heading, by its "
        "cell as Jupyter numbers it, In [n]); under a ✘ what went wrong, what the check tried, the likely cause, "
        "the line of your code, and whether an earlier exercise that fails is probably the cause; then 'K of N "
        "exercises pass'. Exit code 0 when all pass or are skipped, 1 otherwise.",
        epilog=f"{CELL_NUMBERS}. The run goes on after errors and stops after the last check cell; the notebook "
               "file is not changed.")
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
    print("\n".join(report(results)))
    return 0 if all(result[2] is not False for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
