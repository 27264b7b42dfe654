"""The course map: per chapter, the exercises the learner writes, what they are checked against, and the time.

Nothing here is typed twice. A chapter's exercises and their minutes come from its notebook's exercise headings,
`### Exercise N.k: name (★★☆, ~15 min)` (`### Exercise N.k (optional): ...` for an optional one); its reading time
from the words of its markdown cells at `WORDS_PER_MINUTE`. What each chapter is checked against is one line per
chapter in the `{course-plan}` directive of book/index.md:

    ```{course-plan}
    01 | PyTorch's own attention, `F.scaled_dot_product_attention`
    06 | a small CNN trained beside it | 5
    ```

`NN | checked against (MyST inline markup) | minutes its cells take to run on a laptop CPU (optional, default 0)`.
The book renders the table (`CoursePlan`); `python -m tools.course_map` writes the same rows into the README.
A chapter's time is its reading, its required exercises and its run time, rounded to 5 minutes; the optional
exercises' minutes are shown beside it.
"""

import json
import re
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

WORDS_PER_MINUTE = 100  # technical prose with equations and code read closely, as chapters 01-03's own estimates
EXERCISE = re.compile(r"^###\s+Exercise\s+(?P<number>\d+\.\d+)\s*(?P<optional>\(optional\))?\s*:\s*"
                      r"(?P<name>.+?)\s*\((?P<stars>[★☆]+)\s*,\s*~\s*(?P<minutes>\d+)\s*min\)\s*$", re.M)
_NOT_WORDS = re.compile(r"<!--.*?-->|<img\b[^>]*>|!\[[^\]]*\]\([^)]*\)|\]\([^)]*\)|<[^>]+>|data:\S+", re.S)
_WORD = re.compile(r"[A-Za-z0-9][\w'’-]*")


def markdown_cells(path):
    """The sources of a notebook's markdown cells (the notebook read as plain JSON)."""
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "markdown"]


def exercises(path):
    """[(number "2.3", name, optional, minutes)] of a notebook's exercise headings, in order."""
    return [(m["number"], m["name"].strip("` "), bool(m["optional"]), int(m["minutes"]))
            for source in markdown_cells(path) for m in EXERCISE.finditer(source)]


def words(path):
    """The words of a notebook's markdown, images, links' targets, HTML tags and comments left out."""
    return sum(len(_WORD.findall(_NOT_WORDS.sub(" ", source))) for source in markdown_cells(path))


def round5(minutes):
    return max(5, 5 * round(minutes / 5))


def chapter_plan(path, run_minutes=0):
    """What a chapter asks of the learner: a dict of its exercises, reading, exercise, optional and run minutes, and
    the total (reading + required exercises + run, rounded to 5 min)."""
    found = exercises(path)
    reading = words(path) / WORDS_PER_MINUTE
    required = sum(minutes for _, _, optional, minutes in found if not optional)
    optional = sum(minutes for _, _, is_optional, minutes in found if is_optional)
    return {"exercises": found, "reading": round(reading), "required": required, "optional": optional,
            "run": run_minutes, "minutes": round5(reading + required + run_minutes)}


def parse_plan(content):
    """Lines `NN | checked against | run minutes` -> {"NN": (checked against, run minutes)}."""
    plan = {}
    for line in content:
        if not line.strip():
            continue
        number, checked, *rest = [part.strip() for part in line.split("|")] + [""]
        if not re.fullmatch(r"\d\d", number) or len(rest) > 2 or (rest[0] and not rest[0].isdigit()):
            raise ValueError(f"course-plan: expected 'NN | checked against | minutes to run', got {line!r}")
        plan[number] = (checked, int(rest[0] or 0))
    return plan


def plan_of_index(index_text):
    """The `{course-plan}` directive's lines from book/index.md, parsed (``parse_plan``)."""
    match = re.search(r"^```\{course-plan\}[^\n]*\n(.*?)^```", index_text, re.S | re.M)
    if not match:
        raise ValueError("book/index.md has no {course-plan} directive")
    return parse_plan(match.group(1).splitlines())


def you_write(found):
    """The 'you write' cell: the exercise names as code, optional ones marked."""
    return ", ".join(f"`{name}`" + (" (optional)" if optional else "") for _, name, optional, _ in found)


def time_cell(plan):
    text = f"~{plan['minutes']} min"
    return text + (f" (+{plan['optional']} optional)" if plan["optional"] else "")


def total_cell(plans):
    minutes = sum(p["minutes"] for p in plans)
    optional = sum(p["optional"] for p in plans)
    more = f"+{optional} optional" if optional else ""
    if minutes < 120:
        return f"about {minutes} min" + (f" ({more})" if more else "")
    return f"about {minutes / 60:.0f} hours ({minutes} min" + (f", {more})" if more else ")")


def markdown_rows(chapters, plan):
    """The README's table (markdown lines) for the chapters [(number "01", title, notebook path)]."""
    lines = ["| # | chapter | you write | checked against | time |", "|---|---|---|---|---|"]
    plans = []
    for number, title, path in chapters:
        checked, run = plan.get(number, ("", 0))
        plans.append(chapter_plan(path, run))
        cells = [number, title, you_write(plans[-1]["exercises"]), checked, time_cell(plans[-1])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"| | **total** | | | {total_cell(plans)} |")
    return lines


# ---- the Sphinx directive ------------------------------------------------------------------------------------

class course_plan(nodes.General, nodes.Element):
    """Placeholder for the course plan, filled once the toc is known; children: one container per chapter holding
    its parsed 'checked against'."""


class CoursePlan(SphinxDirective):
    """`{course-plan}`: the course map, one content line per chapter (this module's docstring)."""

    has_content = True

    def run(self):
        try:
            plan = parse_plan(self.content)
        except ValueError as err:
            return [self.state.document.reporter.warning(str(err), line=self.lineno)]
        node = course_plan()
        for number, (checked, run) in plan.items():
            box = nodes.container(chapter=number, run=run)
            box += nodes.paragraph("", "", *self.parse_inline(checked)[0]) if checked else nodes.paragraph()
            node += box
        for path in sorted(Path(self.env.srcdir, "chapters").glob("[0-9][0-9]_*.ipynb")):
            self.env.note_dependency(str(path))  # a changed chapter rebuilds the table
        return [node]


def fill_course_plan(app, doctree, fromdocname):
    from course_chapters import make_table  # beside this file

    env = app.env
    for placeholder in list(doctree.findall(course_plan)):
        given = {box["chapter"]: box for box in placeholder.children}
        chapters = [doc for doc in env.toctree_includes.get(env.config.root_doc, []) if doc.startswith("chapters/")]
        rows, plans = [], []
        for doc in chapters:
            number = doc.split("/", 1)[1][:2]
            box = given.get(number)
            if box is None:
                logger.warning("course-plan: no line for chapter %s", number, location=fromdocname)
            plans.append(chapter_plan(env.doc2path(doc), int(box["run"]) if box else 0))
            title = nodes.paragraph()
            ref = nodes.reference("", "", internal=True, refuri=app.builder.get_relative_uri(fromdocname, doc))
            ref += nodes.Text(re.sub(r"^\d+\s*·\s*", "", env.titles[doc].astext()) if doc in env.titles else doc)
            title += ref
            names = nodes.paragraph()
            for i, (_, name, optional, _) in enumerate(plans[-1]["exercises"]):
                names += [nodes.Text(", ")] if i else []
                names += nodes.literal(text=name)
                names += [nodes.Text(" (optional)")] if optional else []
            checked = box.children[0].deepcopy() if box else nodes.paragraph(text="—")
            rows.append([number, title, names, checked, time_cell(plans[-1])])
        rows.append(["", nodes.paragraph("", "", nodes.strong(text="Total")), "", "", total_cell(plans)])
        placeholder.replace_self(make_table(["", "Chapter", "You write", "Checked against", "Time"], rows,
                                            widths=[4, 22, 34, 26, 14]))


def setup(app):
    app.add_node(course_plan)
    app.add_directive("course-plan", CoursePlan)
    app.connect("doctree-resolved", fill_course_plan)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
