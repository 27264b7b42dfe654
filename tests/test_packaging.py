"""The project's install files agree with each other."""

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def requirement_name(spec):
    return re.split(r"[<>=!~ \[;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.repo_text
def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs = project["dependencies"] + extras["dev"] + extras["lab"]
    wanted = {requirement_name(s): s.replace(" ", "") for s in specs}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    got = {requirement_name(s): s.replace(" ", "") for s in pip if not s.startswith("-")}
    assert got == wanted, "environment.yml's pip list must equal pyproject's dependencies + dev and lab extras"
    assert "-e ." in pip, "environment.yml must install the package itself"
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip, "Binder needs the CPU torch, not CUDA's"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.startswith("python=3.1")


@pytest.mark.repo_text
def test_no_torchvision_anywhere():
    for path in ("pyproject.toml", "environment.yml"):
        assert "torchvision" not in (ROOT / path).read_text()


@pytest.mark.repo_text
def test_binder_post_build_is_executable():
    post_build = ROOT / "postBuild"  # Binder ignores root files when a binder/ folder exists
    assert post_build.stat().st_mode & 0o111
    assert "tools.notebooks" in post_build.read_text()


@pytest.mark.repo_text
def test_make_setup_installs_the_lab_extra_and_make_lab_opens_the_notebooks():
    lab = {requirement_name(s) for s in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["lab"]}
    assert {"jupyterlab", "nbconvert"} <= lab
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'pip install --quiet -e "\.\[dev,lab\]"', makefile)
    recipe = re.search(r"^lab: setup\n\t(.+)$", makefile, re.M)
    assert recipe and recipe.group(1) == "$(VENV)/bin/jupyter lab notebooks/"
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and ".venv/bin/jupyter lab notebooks/" in readme


def _version(name):
    try:
        return tuple(int(p) for p in re.findall(r"\d+", importlib.metadata.version(name))[:3])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here (make setup installs it)")


def test_jupyterlab_runs_and_displays_this_ipywidgets():
    """The environment `make setup` made: JupyterLab 4 starts, and its widget extension fits the ipywidgets here
    (ipywidgets 8 needs jupyterlab_widgets 3; ipywidgets 7.7-7.8 need 1.1.11+, the 1.x that loads in JupyterLab 4)."""
    assert _version("jupyterlab")[0] == 4 and _version("nbconvert")[0] >= 7
    widgets, extension = _version("ipywidgets"), _version("jupyterlab_widgets")
    assert extension[0] == 3 if widgets[0] == 8 else (1, 1, 11) <= extension < (2,), (widgets, extension)
    manager = Path(sys.prefix) / "share/jupyter/labextensions/@jupyter-widgets/jupyterlab-manager/package.json"
    assert "^4" in json.loads(manager.read_text())["dependencies"]["@jupyterlab/application"]
    lab = Path(sys.executable).parent / "jupyter-lab"
    run = subprocess.run([str(lab), "--version"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("4."), run.stdout + run.stderr


@pytest.mark.repo_text
def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists its packages: a new subpackage, checkpoint or data folder must be listed there too, or pip
    leaves it out."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(d.relative_to(ROOT).parts) for d in [ROOT / "vit_course", *(ROOT / "vit_course").rglob("*")]
               if d.is_dir() and "__pycache__" not in d.parts}
    assert folders == listed, "list new code, checkpoint or data folders in pyproject"


def test_the_wheel_carries_the_checkpoints_and_the_measurements_chapters_read(tmp_path):
    """What pip installs on Colab: the shipped models, and the measurements the chapters read (vit_course/measurements,
    package data); not the lab's benchmarks/ nor the maintainers' tools/ (student notebooks, the README's tables),
    which work on a checkout only."""
    import shutil
    import zipfile

    from vit_course.checkpoint import PRETRAINED

    # Build from a copy of what git tracks: setuptools' build/ folder in a checkout keeps files deleted since.
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    source = tmp_path / "source"
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    measured = sorted((ROOT / "vit_course" / "measurements").glob("*.json"))
    assert measured, "no measurements in the package: `python -m tools.results` copies them"
    for path in measured:
        assert f"vit_course/measurements/{path.name}" in names
    assert not [n for n in names if n.startswith("benchmarks/") or "benchmark_results" in n]
    for run in PRETRAINED:  # every model load_pretrained offers, chapters 06 to 09 load them on Colab
        assert f"vit_course/checkpoints/{run}/model.pt" in names, f"the wheel lacks the shipped model {run!r}"
    assert "vit_course/cifar10_examples.npz" in names, "the wheel lacks the example images (load_examples)"
    assert "vit_course/photos/chelsea.jpg" in names, "the wheel lacks chapter 05's photo"
    assert "vit_course/results.py" in names and not [n for n in names if n.startswith("tools/")]
    assert "vit_course/notebooks.py" not in names


@pytest.mark.repo_text
def test_grade_needs_nothing_beyond_the_packages_dependencies():
    """`python -m vit_course grade` after a plain `pip install` (Colab, a laptop): every module that grade.py and
    kernel.py import, and the kernel nbclient starts (ipykernel), is a dependency, not a dev extra."""
    import ast

    needed = {"ipykernel"}
    for module in ("grade.py", "kernel.py"):
        for node in ast.walk(ast.parse((ROOT / "vit_course" / module).read_text())):
            if isinstance(node, ast.Import):
                needed |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                needed.add(node.module.split(".")[0])
    third_party = {name for name in needed if name not in sys.stdlib_module_names}
    dependencies = {requirement_name(spec) for spec in
                    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert third_party and third_party <= dependencies, f"grade needs {sorted(third_party - dependencies)}"
