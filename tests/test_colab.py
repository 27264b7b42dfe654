"""Colab: each chapter's link opens a student notebook that exists, training chapters ask for a GPU, and the
setup cell, run in a bare Python with `google.colab` present, installs the course so the chapter runs.

The simulation (test marked `colab`; 75 s on 2 lightly loaded cores, 4 min when they are crowded: a venv and pip
installs; `make test` leaves it out, `make test-colab` runs it, CI runs both). The link and metadata tests read the
notebooks: marked `repo_text` (`make check-text`).
- a fresh venv (no system site-packages) holding what Colab preinstalls and the course does not bring itself:
  torch (`$TORCH`, default torch==2.13.0, from this machine's wheel cache) and ipykernel;
- a stand-in `google.colab` package, imported at start-up by a sitecustomize, as Colab's runtime does;
- VIT_COURSE_REPO = git+file://localhost/<a clone of this repository's HEAD>: what the setup cell would fetch
  from GitHub (with a host: the venv's bundled pip 23.2 rejects "name @ git+file:///path", an empty host);
- a kernel in that venv runs the clone's solutions/01 top to bottom (cwd: an empty folder, like /content).
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = (
    "01_self_attention", "02_multi_head_attention", "03_encoder_block", "04_patch_embeddings",
    "05_vision_transformer", "06_train_mnist", "07_train_cifar10", "08_what_vit_learns", "09_going_further",
)
TRAINING = ("06_train_mnist", "07_train_cifar10")  # chapters that train: Colab should give them a GPU
COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/[\w.-]+/(?P<path>[^)\s\"']+)")
RUN_CHAPTER = "01_self_attention"
TORCH = os.environ.get("TORCH", "torch==2.13.0")


def _written(chapter):
    if not (ROOT / "solutions" / f"{chapter}.ipynb").is_file():
        pytest.skip(f"chapter {chapter} is not written yet")


# ---- fast: links and metadata --------------------------------------------------------------------------------

@pytest.mark.repo_text
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_colab_link_opens_an_existing_student_notebook(chapter):
    _written(chapter)
    for folder in ("solutions", "notebooks"):  # the book shows the solution; Colab opens the student's copy
        path = ROOT / folder / f"{chapter}.ipynb"
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing (python -m tools.notebooks)"
        first = nbformat.read(path, as_version=4).cells[0]
        links = [m["path"] for m in COLAB_LINK.finditer(first.source)]
        assert links == [f"notebooks/{chapter}.ipynb"], f"{folder}/{chapter}: Colab links {links}"
        assert (ROOT / links[0]).is_file()


@pytest.mark.repo_text
@pytest.mark.parametrize("chapter", TRAINING)
def test_training_chapters_ask_colab_for_a_gpu(chapter):
    _written(chapter)
    for folder in ("solutions", "notebooks"):  # Colab reads the student notebook's metadata
        path = ROOT / folder / f"{chapter}.ipynb"
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
        meta = nbformat.read(path, as_version=4).metadata
        assert meta.get("accelerator") == "GPU", f"{folder}/{chapter}: metadata.accelerator is " \
                                                  f"{meta.get('accelerator')!r}, Colab would start without a GPU"


# ---- slow: the setup cell in a fresh environment -------------------------------------------------------------

STAND_IN = '''"""Stand-in for Colab's `google.colab` (tests/test_colab.py): the setup cell checks its presence."""
IN_COLAB = True
'''


def _run(cmd, **kwargs):
    run = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert run.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    return run


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A Colab-like runtime: (kernel name, clone of HEAD, timings in seconds); JUPYTER_PATH points at its kernel."""
    timings, started = {}, time.perf_counter()
    tmp = tmp_path_factory.mktemp("colab")
    clone, venv, stub, content = tmp / "repo", tmp / "venv", tmp / "stub", tmp / "content"
    _run(["git", "clone", "--quiet", str(ROOT), str(clone)])
    timings["clone"] = time.perf_counter() - started
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    # --no-compile: torch's thousands of modules are byte-compiled when imported, not all up front
    _run([python, "-m", "pip", "install", "--quiet", "--no-compile", TORCH, "ipykernel"], timeout=900)
    timings["venv with torch and ipykernel"] = time.perf_counter() - started - timings["clone"]
    probe = subprocess.run([python, "-c", "import vit_course"], capture_output=True, cwd=tmp)
    assert probe.returncode != 0, "vit_course is importable before the setup cell ran: the venv is not fresh"
    (stub / "google" / "colab").mkdir(parents=True)  # `google` stays a namespace package
    (stub / "google" / "colab" / "__init__.py").write_text(STAND_IN)
    (stub / "sitecustomize.py").write_text("import google.colab  # Colab's runtime imports it at start-up\n")
    content.mkdir()
    spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Colab stand-in", "language": "python",
            "env": {"PYTHONPATH": str(stub), "VIT_COURSE_REPO": f"git+file://localhost{clone}",
                    "MPLBACKEND": "module://matplotlib_inline.backend_inline"}}
    (tmp / "jupyter" / "kernels" / "colab").mkdir(parents=True)
    (tmp / "jupyter" / "kernels" / "colab" / "kernel.json").write_text(json.dumps(spec))
    print("\nColab stand-in ready: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(tmp / "jupyter")
    try:
        yield {"kernel": "colab", "clone": clone, "content": content, "venv": venv, "timings": timings}
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.colab
def test_setup_cell_installs_the_course_on_colab_and_the_chapter_runs(colab):
    from nbclient import NotebookClient

    path = colab["clone"] / "solutions" / f"{RUN_CHAPTER}.ipynb"
    if not path.is_file():
        pytest.skip(f"{RUN_CHAPTER} is not committed yet")
    nb = nbformat.read(path, as_version=4)
    setup = nb.cells[1]
    assert "google.colab" in setup.source and "VIT_COURSE_REPO" in setup.source, "not the generated setup cell"
    where = ("import importlib.util, json, sys, google.colab, vit_course\n"
             "from vit_course.results import measurement\n"  # what chapters 07 and 09 read, installed with it
             "print('course from:', vit_course.__file__)\nprint('prefix:', sys.prefix)\n"
             "print('measured:', json.dumps([measurement('data_scaling')['seeds'], "
             "measurement('finetune_resolution')['resolution']]))\nprint('tools:', importlib.util.find_spec('tools'))")
    nb.cells.append(nbformat.v4.new_code_cell(where))
    started = time.perf_counter()
    NotebookClient(nb, kernel_name=colab["kernel"], timeout=600, record_timing=False,
                   resources={"metadata": {"path": str(colab["content"])}}).execute()
    colab["timings"]["setup cell and chapter"] = time.perf_counter() - started
    timings = ", ".join(f"{k} {v:.0f} s" for k, v in colab["timings"].items())
    print(f"\nColab simulation: {timings}; total {sum(colab['timings'].values()):.0f} s")

    assert re.search(r"Using device: (cpu|cuda|mps)", _text(nb.cells[1])), _text(nb.cells[1])
    where = _text(nb.cells[-1])  # what the added last cell printed
    site = str(colab["venv"].resolve())
    assert f"prefix: {site}" in where, where  # the kernel ran in the fresh venv ...
    assert re.search(rf"course from: {re.escape(site)}/lib/python[\d.]+/site-packages/vit_course/", where), \
        where  # ... and imported the course the setup cell installed there, not this checkout
    stored = [json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
              for name in ("data_scaling", "finetune_resolution")]  # the installed copies must match these
    assert f"measured: {json.dumps([stored[0]['seeds'], stored[1]['resolution']])}" in where, where
    assert "tools: None" in where, where  # no maintainer tools
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
