"""Running a notebook in a fresh Jupyter kernel that imports this checkout's ``vit_course`` (every chapter):
re-executing the solutions (``python -m tools.notebooks --execute``) and grading a learner's notebook (``grade``).
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: the kernel imports its vit_course
TIMEOUT = 3600  # seconds per cell: training cells on a slow CPU
WIDGET = "application/vnd.jupyter.widget-view+json"


def run(nb, folder, timeout=TIMEOUT, kernel="python3", allow_errors=False):
    """Execute ``nb``'s cells in place in a fresh kernel with ``folder`` as the working directory.

    jupyter_client replaces the kernelspec's "python" by sys.executable, so the kernel is this interpreter, and
    PYTHONPATH makes it import this checkout's vit_course even if another copy is installed. An error in a cell
    raises (nbclient's CellExecutionError) unless ``allow_errors``. Progress bars are live widgets displayed on
    the side, whose state is not kept: those displays are dropped afterwards, and only the lines printed beside
    them stay. A widget that is a cell's result (an explorer) keeps its output, whose text stands in for it where
    no widget can be drawn.
    """
    from nbclient import NotebookClient  # only needed here: keeps importing the package light

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=allow_errors, record_timing=False,
                            store_widget_state=False, resources={"metadata": {"path": str(folder)}})
    try:
        client.execute(env=env)
    finally:
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = merge_streams([o for o in cell.get("outputs", []) if not (
                    o.get("output_type") == "display_data" and WIDGET in o.get("data", {}))])
    return nb


def merge_streams(outputs):
    """Consecutive prints to the same stream as one output, however the kernel happened to flush them: the stored
    notebook is the same on a busy machine and an idle one."""
    merged = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                and last.get("name") == output.get("name")):
            last["text"] = "".join(last["text"]) + "".join(output["text"])
            continue
        merged.append(output)
    return merged
