"""Chapters of the book: solutions folded, the Colab badge served locally, each chapter's Colab link checked.

The chapters are the solution notebooks themselves (book/chapters -> ../solutions); nothing here edits them.
- `fold_solutions` tags every exercise cell (one holding `### BEGIN SOLUTION`) `hide-input` while the notebook
  is read, so the page shows the solution behind a "Show solution" toggle and its outputs open.
- `strip_markers` then drops the grading markers (`### BEGIN SOLUTION`, `### END SOLUTION`, and the hint
  markers) from the code the book shows, and `strip_copied_sources` from the notebooks the pages offer as
  ".ipynb" downloads (_sources/): they are for `python -m tools.notebooks`, not for the reader.
- `label_setup` names the toggle of the setup cell, which its own `hide-cell` tag (written by
  `python -m tools.notebooks`) folds, input and output, so each chapter opens with its story.
- `point_book_links` turns a chapter's links to the book's pages, `../book/NAME.md` (right from solutions/ and
  notebooks/ in the repository), into `../NAME.md`, the page seen from the book's chapters/ folder.
- `LocalAssets` swaps the Colab badge's remote SVG for `_static/colab-badge.svg` and warns (an error under -W)
  about any other image, script or style that would be fetched from outside: the book must read offline.
- The same pass finds each chapter's Colab link and warns unless it opens `notebooks/<chapter>.ipynb`, a
  student notebook that exists in the repository. The links found feed the `course-map` table of the intro.
"""

import json
import re
from pathlib import Path

from course_links import COLAB_LINK, binder_url, colab_url
from docutils import nodes
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

SOLUTION_MARKER = "### BEGIN SOLUTION"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "_static/colab-badge.svg"
SETUP_PROMPTS = {"code_prompt_show": "Show the setup: install on Colab, seed, pick the device",
                 "code_prompt_hide": "Hide the setup"}
# An attribute that makes a browser fetch something: src= on any tag, href= on <link>, url(...) in a style.
EXTERNAL_FETCH = re.compile(
    r"""(?:\bsrc\s*=\s*["']?|<link\b[^>]*\bhref\s*=\s*["']?|url\(\s*["']?)((?:https?:)?//[^"'\s)>]+)""", re.I
)


def fold_solutions(notebook):
    """Tag each exercise cell of a notebook (a dict in nbformat 4) `hide-input`; returns how many were tagged.

    The code is folded behind a "Show solution" toggle; its outputs stay visible. Idempotent.
    """
    folded = 0
    for cell in notebook.get("cells", []):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if cell.get("cell_type") != "code" or SOLUTION_MARKER not in source:
            continue
        meta = cell.setdefault("metadata", {})
        tags = meta.setdefault("tags", [])
        if not {"hide-input", "hide-cell", "remove-input", "remove-cell"} & set(tags):
            tags.append("hide-input")
        meta["mystnb"] = {"code_prompt_show": "Show solution", "code_prompt_hide": "Hide solution",
                          **meta.get("mystnb", {})}
        folded += 1
    return folded


MARKER_LINE = re.compile(r"^[ \t]*### (?:BEGIN|END) (?:SOLUTION|HINT)\b.*(?:\n|$)", re.M)


def strip_markers(notebook):
    """Drop the grading-marker lines from every code cell of a notebook (a dict in nbformat 4); returns how many
    cells changed. Run after `fold_solutions`, which finds the exercises by their markers."""
    changed = 0
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        stripped = MARKER_LINE.sub("", source)
        if stripped != source:
            cell["source"] = stripped.rstrip("\n")
            changed += 1
    return changed


def label_setup(notebook):
    """Name the toggle of the setup cell (tagged `setup`) when a tag folds it; returns how many were named."""
    named = 0
    for cell in notebook.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.get("cell_type") == "code" and "setup" in tags and {"hide-cell", "hide-input"} & set(tags):
            cell["metadata"]["mystnb"] = {**SETUP_PROMPTS, **cell["metadata"].get("mystnb", {})}
            named += 1
    return named


BOOK_LINK = re.compile(r"\]\(\.\./book/([\w-]+\.md(?:#[\w-]*)?)\)")


def point_book_links(notebook):
    """Point each markdown link `](../book/NAME.md)` of a notebook (a dict) at `](../NAME.md)`; returns how many."""
    moved = 0
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        cell["source"], count = BOOK_LINK.subn(r"](../\1)", source)
        moved += count
    return moved


def on_source_read(app, docname, source):
    """Fold the solutions of a notebook chapter, drop their grading markers, name its setup toggle and point its
    links to the book's pages, as Sphinx reads it (not on disk)."""
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    notebook = json.loads(source[0])
    if fold_solutions(notebook) + strip_markers(notebook) + label_setup(notebook) + point_book_links(notebook):
        source[0] = json.dumps(notebook)


def is_external(uri):
    return bool(re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", uri, re.I)) and not uri.lower().startswith("file:")


class LocalAssets(SphinxTransform):
    """Serve the Colab badge locally, reject other remote assets, record and check each chapter's Colab link."""

    default_priority = 100  # while reading, before the image collector sees the image nodes

    def apply(self):
        docname = self.env.docname
        up = "../" * docname.count("/")  # from the page's HTML back to the site root
        for node in list(self.document.findall(nodes.image)):
            if node["uri"] == COLAB_BADGE:
                node["uri"] = "/" + LOCAL_BADGE  # "/" = relative to the book's source folder
            elif is_external(node["uri"]):
                logger.warning("image fetched from outside (the book must read offline): %s", node["uri"],
                               location=node)
        links = [node["refuri"] for node in self.document.findall(nodes.reference) if "refuri" in node]
        for node in list(self.document.findall(nodes.raw)):
            if "html" not in node.get("format", ""):
                continue
            text = node.astext()
            links += [m.group(0) for m in COLAB_LINK.finditer(text)]
            if COLAB_BADGE in text:
                text = text.replace(COLAB_BADGE, up + LOCAL_BADGE)
                node.replace_self(nodes.raw(text, text, format=node["format"]))
            for match in EXTERNAL_FETCH.finditer(text):
                logger.warning("HTML fetches from outside (the book must read offline): %s", match.group(1),
                               location=node)
        if docname.startswith("chapters/"):
            self.check_colab_link(docname, links)

    def check_colab_link(self, docname, links):
        """Warn unless the chapter links to Colab for notebooks/<chapter>.ipynb, a file of the repository."""
        stem = docname.split("/", 1)[1]
        expected = f"notebooks/{stem}.ipynb"
        found = [m for m in map(COLAB_LINK.match, links) if m]
        if not found:
            logger.warning("chapter %s has no 'Open in Colab' link (expected one to %s)", docname, expected,
                           location=docname)
            return
        for match in found:
            if match["path"] != expected:
                logger.warning("chapter %s: Colab link opens %s, expected %s", docname, match["path"], expected,
                               location=docname)
        repo_root = Path(self.env.srcdir).parent
        if not (repo_root / expected).is_file():
            logger.warning("chapter %s: its Colab link opens %s, which is not in the repository (run "
                           "`python -m tools.notebooks`)", docname, expected, location=docname)
        self.env.course_colab = getattr(self.env, "course_colab", {})
        self.env.course_colab[docname] = (found[0]["repo"], found[0]["branch"], found[0]["path"])


def on_purge_doc(app, env, docname):
    getattr(env, "course_colab", {}).pop(docname, None)


def on_merge_info(app, env, docnames, other):
    env.course_colab = {**getattr(env, "course_colab", {}), **getattr(other, "course_colab", {})}


class course_map(nodes.General, nodes.Element):
    """Placeholder for the course map, filled once every chapter has been read."""


class CourseMap(SphinxDirective):
    """`{course-map}`: a table of the chapters in toc order, each with its Colab and Binder links."""

    def run(self):
        return [course_map()]


def fill_course_map(app, doctree, fromdocname):
    env = app.env
    for placeholder in list(doctree.findall(course_map)):
        chapters = [doc for doc in env.toctree_includes.get(env.config.root_doc, []) if doc.startswith("chapters/")]
        colab = getattr(env, "course_colab", {})
        rows = []
        for number, doc in enumerate(chapters, 1):
            title = nodes.paragraph()
            ref = nodes.reference("", "", internal=True, refuri=app.builder.get_relative_uri(fromdocname, doc))
            ref += nodes.Text(env.titles[doc].astext() if doc in env.titles else doc)
            title += ref
            cells = [nodes.paragraph(text=str(number)), title]
            if doc in colab:
                links = colab[doc]  # (repo, branch, path of the student notebook)
                cells += [_link(colab_url(*links), "Open in Colab"), _link(binder_url(*links), "Open on Binder")]
            else:
                cells += [nodes.paragraph(text="—"), nodes.paragraph(text="—")]
            rows.append(cells)
        placeholder.replace_self(make_table(["", "Chapter", "Colab", "Binder"], rows, widths=[4, 60, 18, 18]))


def _link(url, text):
    para = nodes.paragraph()
    para += nodes.reference("", text, refuri=url)
    return para


def make_table(header, rows, widths):
    """A docutils table from a header of strings and rows of nodes (or strings)."""
    table = nodes.table(classes=["colwidths-given"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=w) for w in widths)
    for section, lines in ((nodes.thead(), [header]), (nodes.tbody(), rows)):
        for line in lines:
            row = nodes.row()
            for cell in line:
                entry = nodes.entry()
                entry += nodes.paragraph(text=cell) if isinstance(cell, str) else cell
                row += entry
            section += row
        group += section
    return table


def dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated scripts. With Sphinx 7.4, the inline scripts of sphinx-thebe and sphinx-togglebutton are
    added twice (once with filename None, once with ''), and a second `const THEBE_JS_URL` is a JavaScript
    error on every page."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        key = (str(getattr(script, "filename", script) or ""), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    if "script_files" in context:
        context["script_files"][:] = kept


def strip_copied_sources(app, exception):
    """The html builder copies each chapter's notebook from disk to _sources/ (the page's ".ipynb" download):
    drop the grading markers from those copies too, once the build is done."""
    if exception is not None or app.builder.format != "html":
        return
    for path in sorted(Path(app.outdir, "_sources").rglob("*.ipynb*")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        if strip_markers(notebook):
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def setup(app):
    app.connect("source-read", on_source_read)
    app.connect("build-finished", strip_copied_sources)
    app.connect("html-page-context", dedupe_scripts)
    app.add_transform(LocalAssets)
    app.connect("env-purge-doc", on_purge_doc)
    app.connect("env-merge-info", on_merge_info)
    app.add_node(course_map)
    app.add_directive("course-map", CourseMap)
    app.connect("doctree-resolved", fill_course_map)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
