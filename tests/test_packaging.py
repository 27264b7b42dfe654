"""The project's install files agree with each other."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def requirement_name(spec):
    return re.split(r"[<>=!~ \[;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["dev"]
    wanted = {requirement_name(s): s.replace(" ", "") for s in specs}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    got = {requirement_name(s): s.replace(" ", "") for s in pip if not s.startswith("-e")}
    assert got == wanted, "environment.yml's pip list must equal pyproject's dependencies + dev extra"
    assert "-e ." in pip, "environment.yml must install the package itself"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.startswith("python=3.1")


def test_no_torchvision_anywhere():
    for path in ("pyproject.toml", "environment.yml"):
        assert "torchvision" not in (ROOT / path).read_text()


def test_binder_post_build_is_executable():
    post_build = ROOT / "postBuild"  # Binder ignores root files when a binder/ folder exists
    assert post_build.stat().st_mode & 0o111
    assert "vit_course notebooks" in post_build.read_text()
