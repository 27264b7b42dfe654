"""The course's diagrams (tools/diagrams.py): drawn the same every time, small, stamped with the code that drew
them; embedded after their markers, carried into the student notebooks, shown by the book; and the check that
fails on a stale picture, a missing one or an unknown marker. The course's own pictures must be current."""

import base64
import io
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from PIL import Image

from tools import diagrams, notebooks

ROOT = Path(__file__).resolve().parents[1]


def tiny(name):
    """A stand-in for render(name): a 4 x 4 PNG stamped like a real diagram (no drawing: fast)."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), "white").save(buffer, format="PNG")
    return diagrams._compact(buffer.getvalue(), f"{name} {diagrams.fingerprint()}")


def counting(draw):
    calls = []

    def counted(name):
        calls.append(name)
        return draw(name)

    return counted, calls


# ---- the pictures -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(diagrams.DIAGRAMS))
def test_a_diagram_is_deterministic_small_sharp_and_stamped(name):
    png = diagrams.render(name)
    assert diagrams.render(name) == png  # the same bytes every time
    spec = diagrams.DIAGRAMS[name]
    image = Image.open(io.BytesIO(png))
    assert image.size == (diagrams.SCALE * spec.width, diagrams.SCALE * spec.height)  # drawn at 2x
    assert len(base64.b64encode(png)) < 80_000
    assert diagrams.png_text(png) == {diagrams.KEY: f"{name} {diagrams.fingerprint()}"}  # and no other metadata
    assert diagrams.problem(name, diagrams.image_line(name, png)) is None


def test_every_chapter_named_in_the_brief_has_its_diagram():
    assert set(diagrams.DIAGRAMS) == {"attention_flow", "heads_split_merge", "pre_post_norm", "image_to_tokens",
                                      "vit_overview"}
    for spec in diagrams.DIAGRAMS.values():
        assert spec.alt and '"' not in spec.alt and "\n" not in spec.alt


# ---- embedding ----------------------------------------------------------------------------------------------------

def test_embed_puts_the_picture_after_its_marker_once():
    draw, calls = counting(tiny)
    text = "## 1. Tokens\n<!-- diagram: attention_flow -->\nThe picture above shows X.\n"
    first, problems = diagrams.embed(text, draw)
    lines = first.split("\n")
    assert lines[:2] == ["## 1. Tokens", "<!-- diagram: attention_flow -->"]
    assert lines[2] == diagrams.image_line("attention_flow", tiny("attention_flow"))
    assert lines[3:] == ["", "The picture above shows X.", ""]  # a blank line: the next paragraph stays markdown
    assert len(problems) == 1 and "missing" in problems[0] and calls == ["attention_flow"]
    assert diagrams.embed(first, draw) == (first, []) and calls == ["attention_flow"]  # current: kept, not redrawn


def test_a_marker_at_the_end_of_a_cell_gets_its_picture():
    text, _ = diagrams.embed("Words.\n\n<!-- diagram: pre_post_norm -->", tiny)
    assert text.split("\n")[-1].startswith('<img src="data:image/png;base64,')


def test_check_names_a_stale_picture_and_a_redraw_replaces_it(monkeypatch):
    current, _ = diagrams.embed("<!-- diagram: vit_overview -->\n", tiny)
    monkeypatch.setattr(diagrams, "fingerprint", lambda: "0123456789abcdef")  # the code changed
    again, problems = diagrams.embed(current, tiny)
    assert len(problems) == 1 and "stale" in problems[0]
    assert again != current and diagrams.embed(again, tiny)[1] == []


@pytest.mark.parametrize("change, expected", [
    (lambda t: t.replace("diagram: vit_overview", "diagram: vit_overveiw"), "unknown diagram 'vit_overveiw'"),
    (lambda t: t.replace('alt="The ViT', 'alt="A ViT'), "alt text or width"),
    (lambda t: t.replace('width="700"', 'width="600"'), "alt text or width"),
    (lambda t: t.replace("base64,iVBOR", "base64,iVBOx"), "stale"),  # not the PNG it was
    (lambda t: t.replace("<img", "<p><img"), "missing"),
])
def test_check_fails_on_a_wrong_picture_or_marker(change, expected):
    current, _ = diagrams.embed("<!-- diagram: vit_overview -->\n\nText.", tiny)
    assert diagrams.embed(current, tiny)[1] == []
    problems = diagrams.embed(change(current), tiny)[1]
    assert len(problems) == 1 and expected in problems[0], problems


def chapter_copy(root, marker="<!-- diagram: attention_flow -->"):
    """A copy of chapter 01 in root/solutions with a marker in its second markdown cell, and a landing page."""
    (root / "solutions").mkdir()
    (root / "book").mkdir()
    path = root / "solutions" / "01_self_attention.ipynb"
    shutil.copy(ROOT / "solutions" / "01_self_attention.ipynb", path)
    nb = nbformat.read(path, as_version=4)
    index = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"][1]
    nb.cells[index].source = f"{marker}\n\n{nb.cells[index].source}"
    path.write_text(notebooks.dumps(nb))
    (root / "book" / "index.md").write_text("# Course\n\n<!-- diagram: vit_overview -->\n\n## More\n")
    return path, index


def test_the_command_fills_a_chapter_and_the_landing_page_and_the_student_copy(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(diagrams, "render", tiny)
    path, index = chapter_copy(tmp_path)
    assert diagrams.main(["--root", str(tmp_path), "--check"]) == 1
    assert "is missing" in capsys.readouterr().out
    assert diagrams.main(["--root", str(tmp_path)]) == 0
    assert diagrams.main(["--root", str(tmp_path), "--check"]) == 0
    solution = nbformat.read(path, as_version=4).cells[index].source
    assert solution.split("\n")[1] == diagrams.image_line("attention_flow", tiny("attention_flow"))
    student = nbformat.read(tmp_path / "notebooks" / path.name, as_version=4).cells[index].source
    assert student.split("\n")[:2] == solution.split("\n")[:2]  # the marker and the picture, unchanged
    assert notebooks.generate(tmp_path, check=True, log=lambda _: None) == []
    page = (tmp_path / "book" / "index.md").read_text()
    assert page.split("\n")[3] == diagrams.image_line("vit_overview", tiny("vit_overview"))
    before = {p: p.read_bytes() for p in [path, tmp_path / "book" / "index.md", tmp_path / "notebooks" / path.name]}
    assert diagrams.main(["--root", str(tmp_path)]) == 0  # a second run changes nothing
    assert all(p.read_bytes() == data for p, data in before.items())

    monkeypatch.setattr(diagrams, "fingerprint", lambda: "0123456789abcdef")  # tools/diagrams.py was edited
    assert diagrams.main(["--root", str(tmp_path), "--check"]) == 1
    assert "stale" in capsys.readouterr().out


def test_an_unknown_marker_fails_the_check_and_the_command_writes_nothing(tmp_path, capsys):
    path, _ = chapter_copy(tmp_path, "<!-- diagram: attention_flows -->")
    before = path.read_bytes()
    assert diagrams.main(["--root", str(tmp_path), "--check"]) == 1
    assert diagrams.main(["--root", str(tmp_path)]) == 1
    assert "unknown diagram 'attention_flows'" in capsys.readouterr().err
    assert path.read_bytes() == before and not (tmp_path / "notebooks").exists()


def test_the_course_pictures_are_current():
    """`make test` fails here (and at `python -m tools.diagrams --check`) until `python -m tools.diagrams` ran."""
    problems = diagrams.generate(ROOT, check=True, log=lambda _: None)
    assert not problems, "run `python -m tools.diagrams`:\n" + "\n".join(problems)


# ---- the book -----------------------------------------------------------------------------------------------------

def test_the_book_shows_an_embedded_picture(tmp_path):
    """A scratch book with the course's MyST settings: the picture after a marker, in a notebook and in a page,
    becomes an <img> with its data URI, alt text and width, without a warning."""
    assert "html_scaled_image_link: false" in (ROOT / "book" / "_config.yml").read_text()  # the book's setting too
    book = tmp_path / "book"
    book.mkdir()
    line = diagrams.image_line("attention_flow", tiny("attention_flow"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        f"# Chapter\n\nWords.\n<!-- diagram: attention_flow -->\n{line}\n\nThe picture above.")])
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    nbformat.write(nb, book / "chapter.ipynb")
    toctree = "```{toctree}\nchapter\n```\n"
    (book / "index.md").write_text(f"# Index\n\n<!-- diagram: attention_flow -->\n{line}\n\n{toctree}")
    (book / "conf.py").write_text("extensions = ['myst_nb']\nnb_execution_mode = 'off'\nexclude_patterns = ['_build']\n"
                                  "myst_enable_extensions = ['html_image', 'dollarmath']\nhtml_theme = 'basic'\n"
                                  "html_scaled_image_link = False\n")  # as book/_config.yml
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", str(book),
                          str(book / "_build")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    src = line.split('"')[1]
    for page in ("chapter.html", "index.html"):
        html = (book / "_build" / page).read_text()
        tag = html[html.rindex("<img", 0, html.index(src)):html.index(">", html.index(src)) + 1]
        assert f'alt="{diagrams.DIAGRAMS["attention_flow"].alt}"' in tag and "width: 700px" in tag, tag
        assert "The picture above" in html or page == "index.html"
