"""``python -m vit_course grade``: one line per check cell, from a notebook run in a real kernel."""

import nbformat
import pytest

from vit_course import grade

CORRECT_TEST = ("import torch\n\n\ndef split_is_correct(split_fn):\n    x = torch.arange(120).reshape(2, 5, 12)\n"
                "    out = split_fn(x, 3)\n    return out.shape == (2, 3, 5, 4) and all(\n"
                "        torch.equal(out[:, i], x[..., 4 * i:4 * i + 4]) for i in range(3))")
VIEW_SPLIT = "def split_heads(x, num_heads):\n    b, n, _ = x.shape\n    return x.view(b, num_heads, n, -1)"
STUB = ('def scaled_dot_product_attention(q, k, v, mask=None):\n    # YOUR CODE HERE\n'
        '    raise NotImplementedError("scaled_dot_product_attention")')
BROKEN = "def pool_tokens(x, pool='cls', num_prefix_tokens=1):\n    return x[:, 0] +"


def notebook(path, *cells):
    """A notebook of markdown (strings starting with '#') and code cells, written to path."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(c) if c.startswith("# ") else nbformat.v4.new_code_cell(c)
                for c in cells]
    nbformat.write(nb, path)
    return path


def test_grades_each_check_cell_in_a_kernel(tmp_path, capsys):
    """Without exercise headings, a line names its check cell as Jupyter numbers it, In [n]."""
    path = notebook(tmp_path / "exercises.ipynb",
                    "# Exercises", "from vit_course import checks",
                    CORRECT_TEST, "checks.split_is_correct(split_is_correct)",  # cells 3-4: passes
                    "# Split", VIEW_SPLIT, "checks.split_heads(split_heads)",  # cells 6-7: fails
                    STUB, "checks.scaled_dot_product_attention(scaled_dot_product_attention)",  # 8-9: untouched
                    BROKEN, "checks.pool_tokens(pool_tokens)",  # 10-11: the exercise cell itself fails
                    "raise RuntimeError('after the last check: never run')")
    before = path.read_text()
    assert grade.main([str(path), "--timeout", "120"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "✔ split_is_correct (In [3])"
    assert lines[1].startswith("✘ split_heads (In [5]): wrong split into 3 heads: largest difference")
    assert lines[2].startswith("    tried: split_heads(tensor(2, 5, 12), 3)")
    assert lines[3].startswith("    likely cause: your heads look reshaped without a transpose")
    assert lines[4] == ("✘ scaled_dot_product_attention (In [7]): not done yet: scaled_dot_product_attention. "
                        "Replace `raise NotImplementedError` in the scaled_dot_product_attention cell with your "
                        "code, run that cell, then run this check again.")
    assert lines[5].startswith("✘ pool_tokens (In [9]): In [8] raised SyntaxError: invalid syntax")
    assert lines[-1] == "1 of 4 exercises pass"
    assert "\x1b" not in "\n".join(lines)
    assert path.read_text() == before  # the learner's file is left alone


def executed(*cells):
    """A notebook as a kernel leaves it: (source, outputs) pairs, outputs as nbformat dicts."""
    nb = nbformat.v4.new_notebook()
    for count, (source, outputs) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs, cell.execution_count = [nbformat.from_dict(o) for o in outputs], count
        nb.cells.append(cell)
    return nb


def stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def error(ename, evalue):
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": []}


def test_all_passing_exits_0(tmp_path, monkeypatch, capsys):
    path = notebook(tmp_path / "done.ipynb", "from vit_course import checks", "checks.MLP(MLP)", "checks.ViT(ViT)")

    def fake_execute(nb, folder, timeout=None, kernel=None):
        nb.cells[1].outputs = [nbformat.from_dict(stream("✔ MLP: passed\n"))]
        nb.cells[2].outputs = [nbformat.from_dict(stream("✔ ViT: passed\n"))]
        for i, cell in enumerate(nb.cells):
            cell.execution_count = i + 1

    monkeypatch.setattr(grade, "execute", fake_execute)
    assert grade.main([str(path)]) == 0
    assert capsys.readouterr().out == "✔ MLP (In [2])\n✔ ViT (In [3])\n2 of 2 exercises pass\n"


def test_verdicts_without_a_kernel():
    nb = executed(
        ("x = 1", []),
        ("checks.MLP(MLP)", [error("CheckFailed", "MLP: wrong output: largest difference 1\n  tried: MLP(6, 24)")]),
        ("class LayerNorm(nn.Module):\n    pass", [error("NameError", "name 'nn' is not defined")]),
        ("checks.LayerNorm(LayerNorm)", [error("NameError", "name 'LayerNorm' is not defined")]),
        ("checks.DropPath(DropPath)", [error("NameError", "\x1b[0;31mname 'DropPath' is not defined\x1b[0m")]),
        ("checks.EncoderBlock(EncoderBlock)", []),
        ("checks.ViT(ViT)", [stream("✔ ViT: passed\n")]),
    )
    assert grade.verdict(nb, 1, "MLP", 0) == (False, "wrong output: largest difference 1\n  tried: MLP(6, 24)")
    assert grade.verdict(nb, 3, "LayerNorm", 2) == (False, "In [3] raised NameError: name 'nn' is not defined")
    assert grade.verdict(nb, 4, "DropPath", 4) == (False, "NameError: name 'DropPath' is not defined")
    assert grade.verdict(nb, 5, "EncoderBlock", 5)[0] is False  # ran, printed nothing
    assert grade.verdict(nb, 6, "ViT", 6) == (True, "")
    nb.cells[6].outputs, nb.cells[6].execution_count = [], None
    assert grade.verdict(nb, 6, "ViT", 6, stopped="CellTimeoutError: cell 5 took too long") == (
        False, "not run (CellTimeoutError: cell 5 took too long)")
    assert grade.cell_number(nb, 6) == "code cell 6" and grade.cell_number(nb, 5) == "In [6]"


PATCHIFY = "def patchify(images, patch_size):\n    return images.flatten(2)"
EMBEDDING = ("class PatchEmbedding(nn.Module):\n    def forward(self, images):\n"
             "        return self.proj(patchify(images, self.patch_size))")


def test_a_failure_that_an_earlier_exercise_explains_says_so(tmp_path, monkeypatch, capsys):
    """Each line names the exercise by the number of its heading, not by the check cell's In [n]."""
    path = notebook(tmp_path / "04.ipynb", "from vit_course import checks",
                    "# 1. Patches\n\n### Exercise 4.1: patchify (★★☆, ~15 min)", PATCHIFY, "checks.patchify(patchify)",
                    "x = unpatchify(patchify(photo, 4), 4, 32)  # a demo cell, not the exercise",
                    "# 2. Embedding\n\n### Exercise 4.2: PatchEmbedding (★★☆, ~15 min)", EMBEDDING,
                    "checks.PatchEmbedding(PatchEmbedding)")
    failures = {3: "patchify: wrong patches of a 12x8 image\n  likely cause: each patch is flattened channels-first",
                7: "PatchEmbedding: wrong patch tokens\n  tried: PatchEmbedding(8, 4, 3, 10)(tensor(2, 3, 8, 8))"}

    def fake_execute(nb, folder, timeout=None, kernel=None):
        for i, cell in enumerate(nb.cells):
            cell.execution_count = i + 1
            if i in failures:
                cell.outputs = [nbformat.from_dict(error("CheckFailed", failures[i]))]

    monkeypatch.setattr(grade, "execute", fake_execute)
    assert grade.main([str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "✘ Exercise 4.1 patchify: wrong patches of a 12x8 image",
        "    likely cause: each patch is flattened channels-first",
        "✘ Exercise 4.2 PatchEmbedding: wrong patch tokens",
        "    tried: PatchEmbedding(8, 4, 3, 10)(tensor(2, 3, 8, 8))",
        "    probably caused by an earlier exercise: your patchify (Exercise 4.1) fails its check and this exercise's "
        "code calls it; fix patchify first",
        "0 of 2 exercises pass"]


def test_check_cells_skip_comments_and_markdown():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("run `checks.MLP(MLP)` below"),
                nbformat.v4.new_code_cell("# checks.LayerNorm(LayerNorm)  (optional, skipped)"),
                nbformat.v4.new_code_cell("print('go')\nchecks.DropPath(DropPath)  # the check")]
    assert grade.check_cells(nb) == [(2, "DropPath")]


@pytest.mark.parametrize("argv, code, says", [
    (["missing.ipynb"], 2, "no notebook at"), (["bad.ipynb"], 2, "cannot read"), (["none.ipynb"], 1, "no check cell"),
])
def test_usage_errors(tmp_path, monkeypatch, capsys, argv, code, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.ipynb").write_text("not json")
    notebook(tmp_path / "none.ipynb", "x = 1")
    assert grade.main(argv) == code
    assert says in capsys.readouterr().err


def test_help_says_how_cells_are_counted(capsys):
    with pytest.raises(SystemExit):
        grade.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "In [n] is the number Jupyter shows beside a code cell" in text
    assert "pytest --nbval-lax calls the same cell 'Cell n-1'" in text


# ---- optional exercises: skipped as the chapter allows is "skipped", not ✘ (nor ✔ on the course's version) ------

LN_STUB = ("class LayerNorm(nn.Module):\n    def __init__(self, dim, eps=1e-6):\n        super().__init__()\n"
           "        # YOUR CODE HERE\n        raise NotImplementedError(\"LayerNorm\")")
DROP_PATH_STUB = ("class DropPath(nn.Module):\n    def __init__(self, p=0.0):\n        super().__init__()\n"
                  "        # YOUR CODE HERE\n        raise NotImplementedError(\"DropPath\")")
MLP = ("class MLP(nn.Module):\n    def __init__(self, dim, hidden_dim, drop=0.0):\n        super().__init__()\n"
       "        self.fc1, self.act, self.drop1 = nn.Linear(dim, hidden_dim), nn.GELU(), nn.Dropout(drop)\n"
       "        self.fc2, self.drop2 = nn.Linear(hidden_dim, dim), nn.Dropout(drop)\n\n"
       "    def forward(self, x):\n        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))")


def chapter_03(path, layer_norm=LN_STUB, drop_path=DROP_PATH_STUB):
    return notebook(path, "# 03", "from torch import nn\nfrom vit_course import checks",
                    "# 3.1\n\n### Exercise 3.1: MLP (★☆☆, ~10 min)", MLP, "checks.MLP(MLP)",
                    "# 3.2\n\n### Exercise 3.2 (optional): LayerNorm (★☆☆, ~10 min)", layer_norm,
                    "checks.LayerNorm(LayerNorm)", "y = LayerNorm(8)(x)  # the cell after the check, skipped too",
                    "# 3.3\n\n### Exercise 3.3 (optional): DropPath (★★☆, ~10 min)", drop_path,
                    "checks.DropPath(DropPath)")


def test_optional_exercises_left_as_the_chapter_allows_are_skipped(tmp_path, capsys):
    """Chapter 03: LayerNorm's stub left in place (was ✘ "not done yet"), DropPath replaced by the course's, as
    the statement says to (was ✔, the check passing on the reference)."""
    path = chapter_03(tmp_path / "03.ipynb", drop_path="from vit_course import DropPath")
    assert grade.main([str(path), "--timeout", "120"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "✔ Exercise 3.1 MLP",
        "– Exercise 3.2 LayerNorm: skipped (optional): its stub still raises NotImplementedError",
        "– Exercise 3.3 DropPath: skipped (optional): the course's DropPath is imported in its place",
        "1 of 1 exercises pass; 2 optional skipped"]


def test_a_written_optional_exercise_is_graded_and_a_skipped_stub_is_named_when_later_code_calls_it(monkeypatch,
                                                                                                     tmp_path, capsys):
    path = notebook(tmp_path / "03.ipynb", "from vit_course import checks",
                    "# 3.2\n\n### Exercise 3.2 (optional): LayerNorm (★☆☆, ~10 min)",
                    "class LayerNorm(nn.Module):\n    pass", "checks.LayerNorm(LayerNorm)",
                    "# 3.3\n\n### Exercise 3.3 (optional): DropPath (★★☆, ~10 min)", DROP_PATH_STUB,
                    "checks.DropPath(DropPath)",
                    "# 3.4\n\n### Exercise 3.4: EncoderBlock (★★☆, ~20 min)",
                    "class EncoderBlock(nn.Module):\n    def __init__(self):\n        self.drop_path1 = DropPath(0.1)",
                    "checks.EncoderBlock(EncoderBlock)")
    failures = {3: ("CheckFailed", "LayerNorm: wrong output: largest difference 2"),
                6: ("CheckFailed", "DropPath: not done yet: DropPath. Replace `raise NotImplementedError` in the "
                                   "DropPath cell with your code, run that cell, then run this check again."),
                9: ("CheckFailed", "EncoderBlock: not done yet: DropPath (EncoderBlock uses it). Replace ...")}

    def fake_execute(nb, folder, timeout=None, kernel=None):
        for i, cell in enumerate(nb.cells):
            cell.execution_count = i + 1
            if i in failures:
                cell.outputs = [nbformat.from_dict(error(*failures[i]))]

    monkeypatch.setattr(grade, "execute", fake_execute)
    assert grade.main([str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "✘ Exercise 3.2 LayerNorm: wrong output: largest difference 2",  # written, wrong: graded like any exercise
        "– Exercise 3.3 DropPath: skipped (optional): its stub still raises NotImplementedError",
        "✘ Exercise 3.4 EncoderBlock: not done yet: DropPath (EncoderBlock uses it). Replace ...",
        "    probably caused by an optional exercise you skipped: this exercise's code calls your DropPath "
        "(Exercise 3.3), whose stub still raises; write it, or use the course's: `from vit_course import DropPath`",
        "0 of 2 exercises pass; 1 optional skipped"]


def test_only_optional_exercises_can_be_skipped_and_only_as_the_chapter_allows():
    nb = executed(("from vit_course import MLP", []),
                  ("checks.MLP(MLP)", [stream("✔ MLP: passed\n")]),
                  ("class DropPath:\n    pass", []),
                  ("checks.DropPath(DropPath)", [stream("✔ DropPath: passed\n")]))
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("### Exercise 3.3 (optional): DropPath (★★☆, ~10 min)"))
    assert grade.optional_exercises(nb) == {"DropPath"}
    assert grade.imports_reference(nb, 0, 2, "MLP")  # imported, but MLP is not optional: grade() never asks
    assert grade.skipped(nb, 4, "DropPath", 3, True, "") is None  # the learner's own DropPath passed: graded ✔
    assert grade.skipped(nb, 4, "DropPath", 3, False, "wrong output") is None  # and failed: ✘
    assert grade.skipped(nb, 4, "DropPath", 3, False, "not done yet: EncoderBlock. Replace ...") is None
    assert grade.skipped(nb, 4, "DropPath", 3, False, "not done yet: DropPath. Replace ...") == (
        "its stub still raises NotImplementedError")
    nb.cells[3].source = "import vit_course\nDropPath = vit_course.DropPath"
    assert grade.skipped(nb, 4, "DropPath", 3, True, "") == "the course's DropPath is imported in its place"
