"""The package's shape, read from its source and CONTRIBUTING.md: small modules and functions, one mechanism in
one place, data flowing one way. All marked `repo_text` (`make check-text`); the tests of the finders they use
with them."""

import ast
import inspect
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.repo_text

PACKAGE = Path(__file__).resolve().parents[1] / "vit_course"
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_functions_are_small():
    """A function does one thing (a module is as long as its one idea needs: no ceiling on modules)."""
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


def import_graph(package):
    """{module: the package's modules it imports, at the top or inside a function} for the package at ``package``
    (a folder), by reading the source. A name imported from the top-level package counts as an import of the module
    its ``__init__`` takes that name from; the top-level ``__init__`` itself, which gathers every name, is no node."""
    top = package.name
    names = {_dotted(path, package): path for path in sorted(package.rglob("*.py"))}
    gathered = {}  # name -> module, for the names the top-level __init__ imports from its modules
    for node in ast.walk(ast.parse((package / "__init__.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            gathered.update({alias.asname or alias.name: f"{top}.{node.module}" for alias in node.names})
    graph = {}
    for module, path in names.items():
        if module == top:
            continue
        here = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here.split(".")[:len(here.split(".")) + 1 - node.level]) if node.level else ""
                base = ".".join(part for part in (base, node.module) if part)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    found.add(target if target in names else gathered.get(alias.name, base) if base == top else base)
        graph[module] = sorted(name for name in found if name in names and name not in (top, module))
    return graph


def _dotted(path, package):
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(graph):
    """Every cycle of ``graph`` ({node: [nodes]}) found by a depth-first walk, each as a list of its nodes."""
    cycles, state = [], {}  # state: 1 while on the walk's path, 2 once done

    def walk(node, path):
        state[node] = 1
        for target in graph.get(node, ()):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                walk(target, path + [target])
        state[node] = 2

    for node in graph:
        if node not in state:
            walk(node, [node])
    return cycles


def test_no_import_cycle_among_the_modules():
    """Data flows one way: nothing in vit_course imports a module that imports it back, even inside a function."""
    graph = import_graph(PACKAGE)
    assert "vit_course.download" in graph["vit_course.data"]  # the graph sees what it should
    assert "vit_course.train" in graph["vit_course.loop"]
    assert "vit_course.vit" in graph["vit_course.checks.ch05_vision_transformer"]
    assert not import_cycles(graph), f"import cycles: {import_cycles(graph)}"


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")  # the way data once imported download
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from .. import f\n")  # a name the package gathers from a
    assert import_graph(package) == {"pkg.a": ["pkg.sub.b"], "pkg.sub": [], "pkg.sub.b": ["pkg.a"]}
    assert import_cycles(import_graph(package)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    (package / "sub" / "b.py").write_text("import os\n")
    assert import_cycles(import_graph(package)) == []


def reference_imports_astray(checks):
    """The imports in the folder ``checks`` (a subpackage) that reach the rest of its package other than the one way,
    a ``from .. import module`` at the top of a module: each as "file:line import". An import inside a function, an
    ``import <package>`` and a ``from ..module import name`` all count."""
    top, astray = checks.parent.name, []
    for path in sorted(checks.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                up = any(alias.name.split(".")[0] == top for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                up = node.level > 1 or (node.level == 0 and (node.module or "").split(".")[0] == top)
                if up and node.level == 2 and node.module is None and node in tree.body:
                    continue  # the one way: from .. import attention as ref
            else:
                continue
            if up:
                astray.append(f"{path.relative_to(checks).as_posix()}:{node.lineno} {ast.unparse(node)}")
    return astray


def test_checks_reach_the_reference_one_way():
    """Each check module imports its reference module at its top (``from .. import attention as ref``), nothing else of
    the package and nothing later, so what a check compares with is in plain sight and nothing runs back up."""
    assert not reference_imports_astray(PACKAGE / "checks"), reference_imports_astray(PACKAGE / "checks")


def test_the_reference_finder_finds_a_lazy_import(tmp_path):
    checks = tmp_path / "pkg" / "checks"
    checks.mkdir(parents=True)
    (checks / "a.py").write_text("from .. import train as ref\nfrom .core import check\n")
    assert reference_imports_astray(checks) == []
    (checks / "b.py").write_text("def reference(name):\n    import pkg\n\n    return getattr(pkg, name)\n")
    (checks / "c.py").write_text("from ..patches import to_pair\n\n\ndef f():\n    from .. import train\n")
    assert reference_imports_astray(checks) == ["b.py:2 import pkg", "c.py:1 from ..patches import to_pair",
                                                 "c.py:5 from .. import train"]


def test_the_course_reads_no_load_or_process_files():
    """Thread watching, load sampling and timing trials belong to benchmarks/, not to what a learner reads."""
    for path in MODULES:
        for foreign in ("/proc/stat", "/proc/self", "/proc/uptime"):
            assert foreign not in path.read_text(), f"{path.relative_to(PACKAGE)} reads {foreign}"


LAB = PACKAGE.parent / "benchmarks"


def imports_of_the_lab(package, lab):
    """The imports in ``package`` (a folder) of the lab: ``benchmarks``, ``tools`` or a script of ``lab`` by its
    module name (the scripts import each other as ``common``, ``machine``), each as "file:line import"."""
    foreign = {"benchmarks", "tools"} | {path.stem for path in lab.glob("*.py")}
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(name.split(".")[0] in foreign for name in names):
                found.append(f"{path.relative_to(package).as_posix()}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_course_never_imports_the_lab():
    """The course never imports the lab (benchmarks/) nor the maintainers' tools/: a learner's pip install has
    neither."""
    assert not imports_of_the_lab(PACKAGE, LAB), imports_of_the_lab(PACKAGE, LAB)


def test_the_lab_import_finder_finds_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "machine.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("import os\nfrom .device import machine\n\n\ndef f():\n"
                                            "    from machine import machine\n    import benchmarks.common\n")
    assert imports_of_the_lab(tmp_path / "pkg", tmp_path / "lab") == [
        "a.py:6 from machine import machine", "a.py:7 import benchmarks.common"]


def test_the_course_reads_no_file_outside_the_package():
    """Importing the course and reading every measurement a chapter shows opens, lists or globs nothing in the
    checkout outside vit_course/ (benchmarks/results, tools/, solutions/): what a chapter shows ships as package
    data, so a pip-installed course reads the same. Watched in a fresh interpreter with an audit hook."""
    import subprocess
    import sys

    from tools.results import chapter_measurements

    script = f"""
import os, sys
root, package = {str(PACKAGE.parent)!r}, {str(PACKAGE)!r}
outside = []
def importing():  # the import system searching sys.path, not the course reading a file
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame is not None
def watch(event, args):
    if event in ("open", "os.listdir", "os.scandir", "glob.glob") and args and isinstance(args[0], (str, bytes)) \
            and not importing():
        path = os.path.abspath(os.fsdecode(args[0]))
        inside = [p for p in (package, sys.prefix, sys.base_prefix) if os.path.commonpath([p, path]) == p]
        if os.path.commonpath([root, path]) == root and not inside:
            outside.append(event + " " + path)
sys.addaudithook(watch)
import vit_course, vit_course.results, vit_course.recipes, vit_course.grade
for name in {chapter_measurements()!r}:
    vit_course.results.measurement(name)
print(outside)
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=PACKAGE.parent, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout[-3000:]


def test_fit_takes_at_most_eleven_parameters():
    """The model, its three loaders (training, validation, the test read once), its settings and how it runs."""
    from vit_course import fit

    assert len(inspect.signature(fit).parameters) <= 11, list(inspect.signature(fit).parameters)


def test_recipes_hold_recipes_only():
    source = (PACKAGE / "recipes.py").read_text()
    for foreign in ("/proc", "matplotlib", "plt.", "savefig"):
        assert foreign not in source, f"recipes.py mentions {foreign!r}: it belongs in device.py or plots.py"


def contributing_map(heading):
    """The files named in the first column of the table under ``heading`` in CONTRIBUTING.md: `x.py` and `x/`."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in cells for name in re.findall(r"`([\w/.]+)`", cell) if name.endswith((".py", "/"))}


def test_contributing_maps_the_package_and_the_tools_as_they_are():
    """CONTRIBUTING's package map names every module and subpackage of vit_course and nothing else; its tools map
    every module of tools/ (the maintainers' tooling, outside the package)."""
    package = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"} | {
        f"{d.name}/" for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()}
    assert contributing_map("## Package map (each module maps onto chapters)") == package
    tools = {f"tools/{p.name}" for p in (PACKAGE.parent / "tools").glob("*.py") if p.name != "__init__.py"}
    assert contributing_map("## Maintainer tooling (`tools/`, not installed)") == tools
    uses = [p.relative_to(PACKAGE).as_posix() for p in MODULES
            if re.search(r"^\s*(from|import) tools\b", p.read_text(), re.M)]
    assert not uses, f"the installed package cannot import the repository's tools/: {uses}"
