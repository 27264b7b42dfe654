"""Build the course book offline, with warnings as errors, and check that nothing in it comes from outside.

    python book/build.py [--out DIR] [--all]
    VIT_COURSE_REPO=git+https://github.com/OWNER/REPO@BRANCH python book/build.py   # a fork's Colab/Binder links

Renders the stored outputs of solutions/NN_*.ipynb (never executes them) with Jupyter Book 1 into
DIR/_build/html (default: book/_build/html), then scans the HTML and CSS for scripts, styles, fonts or
images fetched from another host. Exits non-zero on a missing chapter, any Sphinx warning (a broken
cross-reference, a file missing from or left out of the toc, a VIT_COURSE_REPO not on GitHub) or any external
asset; prints where the book is. The Colab and Binder links follow VIT_COURSE_REPO (book/_ext/course_links.py).
"""

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

BOOK = Path(__file__).resolve().parent
CHAPTERS = (
    "01_self_attention", "02_multi_head_attention", "03_encoder_block", "04_patch_embeddings",
    "05_vision_transformer", "06_train_mnist", "07_train_cifar10", "08_what_vit_learns", "09_going_further",
)
# What makes a browser fetch: src= on any tag, href= on <link>, url(...) and @import in CSS.
_FETCH = re.compile(
    r"""\bsrc\s*=\s*["']?(?P<src>[^"'\s>]+)"""
    r"""|<link\b[^>]*?\bhref\s*=\s*["']?(?P<link>[^"'\s>]+)"""
    r"""|\burl\(\s*["']?(?P<url>[^"')\s]+)"""
    r"""|@import\s+["'](?P<imp>[^"']+)""",
    re.I,
)
_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)
_JB = "import sys; from jupyter_book.cli.main import main; sys.exit(main())"  # its CLI, in this Python
_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.I | re.S)


def missing_chapters(book=BOOK):
    """Names of the nine chapters whose notebook is not in book/chapters (i.e. solutions/)."""
    return [name for name in CHAPTERS if not (book / "chapters" / f"{name}.ipynb").is_file()]


def external_fetches(text, css=False):
    """URLs on another host that this HTML (or CSS) text makes a browser fetch.

    Links (`<a href>`) are not fetches and are ignored; so is text inside inline scripts, where URLs are
    data (e.g. a theme's list of icon sites), though a script's own src= is checked.
    """
    if not css:
        text = _SCRIPT.sub(lambda m: m.group(0).split(">", 1)[0] + ">", text)  # keep the tag, drop the body
    found = []
    for match in _FETCH.finditer(text):
        url = next(v for v in match.groups() if v is not None)
        if _REMOTE.match(url):
            found.append(url)
    return found


def external_assets(html_dir):
    """(file, url) for every external fetch in the built site's .html and .css files."""
    html_dir = Path(html_dir)
    hits = []
    for path in sorted(html_dir.rglob("*")):
        if path.suffix in (".html", ".css") and "_sources" not in path.parts:
            text = path.read_text(encoding="utf-8", errors="replace")
            hits += [(path.relative_to(html_dir), url) for url in external_fetches(text, css=path.suffix == ".css")]
    return hits


def build(out=None, rebuild_all=False):
    """Build the book into `out`/_build/html (default book/_build/html). Returns that folder; raises on failure."""
    missing = missing_chapters()
    if missing:
        raise RuntimeError(f"missing chapter notebooks in solutions/: {', '.join(missing)}")
    cmd = [sys.executable, "-c", _JB, "build", str(BOOK), "-W", "-n", "--keep-going"]
    if out is not None:
        cmd += ["--path-output", str(out)]
    if rebuild_all:
        cmd.append("--all")
    result = subprocess.run(cmd, cwd=BOOK.parent)
    if result.returncode != 0:
        raise RuntimeError(f"jupyter-book build failed (exit {result.returncode}); the warnings above say why")
    html = Path(out or BOOK) / "_build" / "html"
    hits = external_assets(html)
    if hits:
        listing = "\n".join(f"  {file}: {url}" for file, url in hits[:20])
        raise RuntimeError(f"{len(hits)} asset(s) would be fetched from outside; the book must read offline:\n"
                           f"{listing}")
    return html


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder (default: book/)")
    parser.add_argument("--all", action="store_true", help="rebuild every page, not just the changed ones")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        html = build(args.out, args.all)
    except RuntimeError as err:
        print(f"make book: {err}", file=sys.stderr)
        return 1
    print(f"\nThe book is built ({time.perf_counter() - start:.0f} s): open {html.resolve() / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
