"""The package's shape: small modules and functions, one mechanism in one place, a model that saves itself."""

import ast
from pathlib import Path

import torch

from vit_course import ViT, load_checkpoint, save_checkpoint

PACKAGE = Path(__file__).resolve().parents[1] / "vit_course"
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_modules_and_functions_are_small():
    long_modules = {p.relative_to(PACKAGE).as_posix(): n for p in MODULES
                    if (n := len(p.read_text().splitlines())) > 250}
    assert not long_modules, f"modules over 250 lines: {long_modules}"
    long_functions = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long_functions, f"functions over 60 lines: {long_functions}"


def test_every_module_says_its_chapter_and_job():
    missing = [p.relative_to(PACKAGE).as_posix() for p in MODULES
               if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"


def test_one_atomic_writer():
    renames = [p.relative_to(PACKAGE).as_posix() for p in MODULES for _ in range(p.read_text().count("os.replace("))]
    assert renames == ["files.py"], renames


def test_recipes_hold_recipes_only():
    source = (PACKAGE / "recipes.py").read_text()
    for foreign in ("/proc", "matplotlib", "plt.", "savefig"):
        assert foreign not in source, f"recipes.py mentions {foreign!r}: it belongs in device.py or plots.py"


def test_a_directly_built_vit_saves_and_rebuilds(tmp_path):
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=5, dim=32, depth=2, num_heads=4,
                mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=None).eval()
    images = torch.randn(3, 3, 16, 16)
    save_checkpoint(tmp_path / "vit.pt", model)
    rebuilt, state = load_checkpoint(tmp_path / "vit.pt")
    assert state["config"] == model.config and rebuilt.config == model.config
    assert torch.equal(rebuilt(images), model(images))
