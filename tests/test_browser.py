"""The built book in a real browser: headless Chromium (Debian's package) driven by Playwright, on loopback.

Every page (the appendix "How the recipes were chosen" too, with its tables): no failed request, no JavaScript
error, every `.math` element rendered by MathJax, every image loaded. Chapters: the Colab link opens
notebooks/<chapter>.ipynb, a file of the repository; each solution toggle opens and closes; a cell's print-out is
one block; the search page finds the chapter by a word of its own; chapter 07's link opens the appendix.
Screenshots of chapter 01 at desktop (1280 px) and phone (390 px) widths go to book/_build/screenshots/ (CI
artifacts); at both widths the page fits the window.

    make book && .venv/bin/python -m pytest -m browser tests/test_browser.py     # ~2 min on 2 busy cores

Marked `browser`. Skips when playwright or chromium is missing (`pip install playwright`, `apt-get install
chromium`; Playwright's own browser download is not used). Builds the book if book/_build/html is missing.
VIT_COURSE_BOOK_HTML=path/to/_build/html tests another build (its repository is the folder holding book/);
CHROMIUM=path picks another browser binary.
"""

import functools
import html as html_lib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = (
    "01_self_attention", "02_multi_head_attention", "03_encoder_block", "04_patch_embeddings",
    "05_vision_transformer", "06_train_mnist", "07_train_cifar10", "08_what_vit_learns", "09_going_further",
)
PAGES = ("index", "results", "glossary", "references", "recipes", "genindex", *(f"chapters/{c}" for c in CHAPTERS))
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# A closed network: nothing may reach outside, and Chromium must not try (updates, sync, field trials).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
COLAB = re.compile(r"^https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/[\w.-]+/(?P<path>\S+)$")

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright; "
                                                             "its own browser download is not needed)")
if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=path)",
                allow_module_level=True)


# ---- the site, the server, the browser -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def site():
    """The built book's html folder; built with book/build.py (what `make book` runs) if it is missing."""
    html = Path(os.environ.get("VIT_COURSE_BOOK_HTML", ROOT / "book" / "_build" / "html")).resolve()
    if not (html / "index.html").is_file():
        missing = [c for c in CHAPTERS if not (ROOT / "solutions" / f"{c}.ipynb").is_file()]
        if missing:
            pytest.skip(f"the book is not built and cannot be yet: solutions/ lacks {', '.join(missing)}")
        run = subprocess.run([sys.executable, str(ROOT / "book" / "build.py")], capture_output=True, text=True)
        assert run.returncode == 0, f"make book failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return html


@pytest.fixture(scope="module")
def base_url(site):
    """http://127.0.0.1:PORT/ serving the site from a thread; stopped after the module."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the browser's view of failures is what the tests check
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


# Images may be lazy: load them all, then report what each one got.
IMAGES_JS = """async () => Promise.all([...document.images].map(async img => {
    img.loading = "eager";
    if (!img.complete) await new Promise(done => { img.onload = img.onerror = done; });
    return [img.getAttribute("src"), img.naturalWidth];
}))"""
# Wait for MathJax (if the page loads it) to finish typesetting.
MATHJAX_JS = """async () => {
    if (!document.querySelector("script[src*='mathjax']")) return "none";
    for (let i = 0; i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++)
        await new Promise(r => setTimeout(r, 50));
    if (!(window.MathJax && MathJax.startup)) return "MathJax never started";
    await MathJax.startup.promise;
    return "done";
}"""
MATH_JS = """() => {
    const math = [...document.querySelectorAll(".math")];
    return {math: math.length, unrendered: math.filter(m => !m.querySelector("mjx-container"))
                                              .map(m => m.textContent.trim().slice(0, 60)),
            containers: document.querySelectorAll("mjx-container").length,
            errors: [...document.querySelectorAll("mjx-merror")].map(e => e.textContent.slice(0, 60))};
}"""


# Output blocks right after another of the same stream: one print-out cut into boxes (myst-nb: nb_merge_streams).
SPLIT_STREAMS_JS = """() => [...document.querySelectorAll(".cell_output")].flatMap(out => {
    const kids = [...out.children], kind = k => k.classList.contains("stderr") ? "stderr" : "stdout";
    return kids.slice(1).filter((k, i) => k.classList.contains("stream") && kids[i].classList.contains("stream")
                                          && kind(k) === kind(kids[i])).map(k => k.textContent.trim().slice(0, 60));
})"""


class Visit:
    """One page opened in a fresh browser context (no state carried over), with what went wrong on the way."""

    def __init__(self, browser, url, **context):
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.problems = []  # failed requests and JavaScript errors, in order
        self.page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console error: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"JavaScript error: {e}"))
        self.page.goto(url, wait_until="load")
        self.mathjax = self.page.evaluate(MATHJAX_JS)
        self.page.wait_for_load_state("networkidle")  # fonts MathJax asks for, the search index, ...
        self.images = self.page.evaluate(IMAGES_JS)
        self.math = self.page.evaluate(MATH_JS)
        self.split_streams = self.page.evaluate(SPLIT_STREAMS_JS)

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def visit(browser, base_url):
    """visit("chapters/01_self_attention") -> its Visit (opened once per module, at desktop width)."""
    opened = {}

    def get(name):
        if name not in opened:
            opened[name] = Visit(browser, f"{base_url}{name}.html", viewport={"width": 1280, "height": 800})
        return opened[name]

    yield get
    for v in opened.values():
        v.close()


def book_dir(site):
    return site.parents[1]  # .../book/_build/html -> .../book


def chapter_built(site, chapter):
    if not (site / "chapters" / f"{chapter}.html").is_file():
        pytest.skip(f"chapter {chapter} is not written yet")


# ---- every page ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PAGES)
def test_page_loads_without_failed_requests_or_javascript_errors(site, visit, name):
    if name.startswith("chapters/"):
        chapter_built(site, name.split("/")[1])
    v = visit(name)
    assert v.problems == [], f"{name}.html:\n" + "\n".join(v.problems)
    assert v.mathjax in ("none", "done"), f"{name}.html: {v.mathjax}"


@pytest.mark.parametrize("name", PAGES)
def test_every_image_loads(site, visit, name):
    if name.startswith("chapters/"):
        chapter_built(site, name.split("/")[1])
    broken = [src for src, width in visit(name).images if width == 0]
    assert broken == [], f"{name}.html: images that did not load: {broken}"


@pytest.mark.parametrize("name", PAGES)
def test_math_is_rendered_by_mathjax(site, visit, name):
    if name.startswith("chapters/"):
        chapter_built(site, name.split("/")[1])
    v = visit(name)
    if v.math["math"] == 0:
        pytest.skip(f"{name}.html has no math")
    assert v.mathjax == "done", f"{name}.html has {v.math['math']} math elements but no MathJax ({v.mathjax})"
    assert v.math["unrendered"] == [], f"{name}.html: math left as TeX: {v.math['unrendered'][:5]}"
    assert v.math["containers"] >= v.math["math"] and v.math["errors"] == [], (name, v.math)


def test_the_book_has_math_and_figures(site, visit):
    """The checks above skip pages without math or images; make sure they did run somewhere."""
    chapter_built(site, CHAPTERS[0])
    first = visit(f"chapters/{CHAPTERS[0]}")
    assert first.math["math"] >= 10, first.math
    assert sum(1 for src, _ in first.images if src.startswith("../_images/") and src.endswith(".png")) >= 1
    assert visit("glossary").math["math"] >= 5


def test_appendix_shows_its_tables_and_the_chapters_lead_to_it(site, visit, browser, base_url):
    """The appendix "How the recipes were chosen" shows its generated tables; chapter 07's link opens it."""
    page = visit("recipes").page
    assert "How the recipes were chosen" in page.title()
    source = (book_dir(site) / "recipes.md").read_text(encoding="utf-8")
    # the generated tables, and the summary written as a table at the top
    expected = len(re.findall(r"```\{recipe-table\}", source)) + len(re.findall(r"^:::\{table\}", source, re.M))
    tables = page.locator("article table")
    assert expected and tables.count() == expected, f"{tables.count()} tables on the page, {expected} in its source"
    for i in range(tables.count()):
        assert tables.nth(i).locator("tbody tr").count() >= 1 and tables.nth(i).is_visible(), f"table {i + 1}"
    chapter = "07_train_cifar10"
    chapter_built(site, chapter)
    v = Visit(browser, f"{base_url}chapters/{chapter}.html")
    try:
        link = v.page.locator("article a[href='../recipes.html']").last  # the text's, not the navigation's
        assert link.is_visible(), f"{chapter}: no visible link to the appendix in its text"
        link.click()
        v.page.wait_for_load_state("load")
        assert v.page.url.split("#")[0].endswith("/recipes.html"), v.page.url
        assert v.problems == [], "\n".join(v.problems)
    finally:
        v.close()


# ---- chapters ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_links_to_colab_for_its_student_notebook(site, visit, chapter):
    chapter_built(site, chapter)
    page = visit(f"chapters/{chapter}").page
    links = page.locator("a[href*='colab.research.google.com']")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert hrefs, f"{chapter}: no link to Colab"
    for href in hrefs:
        match = COLAB.match(href)
        assert match and match["path"] == f"notebooks/{chapter}.ipynb", f"{chapter}: Colab link {href}"
    assert (book_dir(site).parent / "notebooks" / f"{chapter}.ipynb").is_file(), \
        f"{chapter}: the Colab link opens notebooks/{chapter}.ipynb, which is not in the repository"
    assert links.first.is_visible(), f"{chapter}: the Colab badge is not visible"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solution_toggles_open_and_close(site, visit, chapter):
    chapter_built(site, chapter)
    notebook = json.loads((book_dir(site) / "chapters" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    exercises = sum(1 for cell in notebook["cells"]  # the cells the book folds (course_chapters.fold_solutions)
                    if cell["cell_type"] == "code" and "### BEGIN SOLUTION" in "".join(cell["source"]))
    page = visit(f"chapters/{chapter}").page
    toggles = page.locator("div.cell:not(.tag_setup) > details.above-input")  # the folded setup cell apart
    if exercises == 0:
        assert toggles.count() == 0, f"{chapter}: folded code but no exercise"
        pytest.skip(f"{chapter} has no exercise")
    assert toggles.count() == exercises, f"{chapter}: {toggles.count()} solution toggles for {exercises} exercises"
    text = page.evaluate("document.body.textContent")  # folded parts included
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text, f"{chapter}: the page has grading markers"
    for i in range(toggles.count()):
        toggle = toggles.nth(i)
        code, summary = toggle.locator(".cell_input"), toggle.locator("summary")
        assert not code.is_visible(), f"{chapter}: solution {i + 1} is open before any click"
        assert "Show solution" in summary.inner_text()
        summary.click()
        assert code.is_visible(), f"{chapter}: solution {i + 1} does not open"
        shown = code.inner_text()
        assert "BEGIN SOLUTION" not in shown and "END SOLUTION" not in shown, f"{chapter}: solution {i + 1} shows " \
            "the grading markers"
        assert "Hide solution" in summary.inner_text()
        summary.click()
        assert not code.is_visible(), f"{chapter}: solution {i + 1} does not close"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_printed_output_shows_as_one_block(site, visit, chapter):
    """A cell's print-out is one box, not cut where the kernel happened to flush (a table in four pieces)."""
    chapter_built(site, chapter)
    split = visit(f"chapters/{chapter}").split_streams
    assert split == [], f"{chapter}: {len(split)} print-outs continue in a new box, e.g. {split[:3]}"


def _article_words(path):
    """Words (of 8+ letters, the way Sphinx's index splits them) of a page's prose, without math."""
    text = path.read_text(encoding="utf-8")
    article = re.search(r"<article\b.*?</article>", text, re.S)
    text = article.group(0) if article else text
    text = re.sub(r"<(span|div) class=\"math[^\"]*\">.*?</\1>", " ", text, flags=re.S)
    prose = " ".join(re.findall(r"<p\b[^>]*>(.*?)</p>", text, re.S))
    prose = html_lib.unescape(re.sub(r"<[^>]+>", " ", prose)).lower()
    return Counter(w for w in re.findall(r"\w+", prose) if w.isalpha() and w.isascii() and len(w) >= 8)


def search_word(site, chapter):
    """The word of the chapter's prose that the fewest pages share (then: used most in the chapter)."""
    pages = {p: _article_words(site / f"{p}.html") for p in PAGES if (site / f"{p}.html").is_file()}
    own = pages[f"chapters/{chapter}"]
    shared = Counter(w for words in pages.values() for w in words)
    assert own, f"{chapter}: no prose to search for"
    return min(own, key=lambda w: (shared[w], -own[w], w))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_search_finds_the_chapter_by_a_word_in_it(site, browser, base_url, chapter):
    chapter_built(site, chapter)
    word = search_word(site, chapter)
    v = Visit(browser, f"{base_url}search.html?q={word}")
    try:
        v.page.wait_for_function("""() => { const s = document.querySelector("#search-results .search-summary");
                                            return s && /found|did not match/i.test(s.textContent); }""")
        found = v.page.locator("#search-results ul.search li a").evaluate_all("as => as.map(a => a.href)")
        assert any(href.split("?")[0].split("#")[0].endswith(f"chapters/{chapter}.html") for href in found), \
            f"searching {word!r} did not find {chapter}: {found}"
        assert v.problems == [], "\n".join(v.problems)
    finally:
        v.close()


# ---- how it looks --------------------------------------------------------------------------------------------

def _save_screenshot(page, path, **kwargs):
    """page.screenshot written atomically (temporary file, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        page.screenshot(path=tmp, **kwargs)
        os.chmod(tmp, 0o644)  # mkstemp's file is private; a CI artifact is meant to be read
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@pytest.mark.parametrize("device", [
    {"name": "desktop", "viewport": {"width": 1280, "height": 800}},
    {"name": "phone", "viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True,
     "has_touch": True},
], ids=lambda d: d["name"])
def test_chapter_screenshots_and_layout(site, browser, base_url, device):
    """book/_build/screenshots/01_self_attention-{desktop,phone}{,-figure}.png; the page fits the screen's width."""
    chapter = CHAPTERS[0]
    chapter_built(site, chapter)
    device = dict(device)
    name = device.pop("name")
    v = Visit(browser, f"{base_url}chapters/{chapter}.html", **device)
    try:
        out = site.parent / "screenshots"
        _save_screenshot(v.page, out / f"{chapter}-{name}.png")
        figure = v.page.locator(".cell_output img").first
        figure.scroll_into_view_if_needed()
        _save_screenshot(v.page, out / f"{chapter}-{name}-figure.png")
        width, page_width = v.page.evaluate("() => [window.innerWidth, document.documentElement.scrollWidth]")
        assert page_width <= width + 1, f"{name}: the page is {page_width} px wide in a {width} px window"
        article = v.page.locator("article.bd-article").bounding_box()
        assert article["width"] >= 0.8 * min(width, 700), f"{name}: the text column is {article['width']:.0f} px"
        if name == "phone":  # the navigation folds away on a phone, leaving the text the whole width
            assert not v.page.locator("#pst-primary-sidebar").is_visible()
        assert v.problems == [], "\n".join(v.problems)
    finally:
        v.close()


DIAGRAM_PAGES = ("index", *(f"chapters/{c}" for c in CHAPTERS[:5]))  # the pages with a diagram (tools/diagrams.py)


@pytest.mark.parametrize("name", DIAGRAM_PAGES)
def test_each_idea_shows_its_diagram(site, visit, name):
    """The diagram drawn into the page (a PNG in a data: URL, so it also shows in Colab and JupyterLab) loads, at its
    2x resolution, and is shown about as wide as the text column. book/_build/screenshots/diagram-<page>.png."""
    if name.startswith("chapters/"):
        chapter_built(site, name.split("/")[1])
    page = visit(name).page
    diagram = page.locator('article img[src^="data:image/png"]').first
    natural, shown = diagram.evaluate("img => [img.naturalWidth, img.getBoundingClientRect().width]")
    assert natural >= 1000 and 500 <= shown <= 760, f"{name}.html: diagram {natural} px, shown at {shown:.0f} px"
    diagram.scroll_into_view_if_needed()
    _save_screenshot(page, site.parent / "screenshots" / f"diagram-{name.split('/')[-1]}.png")
