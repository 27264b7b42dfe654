"""The README's course table, written from the chapters (``book/_ext/course_map.py``): who writes what, checked
against what (the ``{course-plan}`` lines of book/index.md), and how long each chapter takes.

    python -m tools.course_map            # rewrite the table between its markers in README.md
    python -m tools.course_map --check    # exit 1 if it is stale
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import course_map  # noqa: E402

BEGIN, END = "<!-- course map: written by `python -m tools.course_map` -->", "<!-- end of course map -->"


def title(path):
    """A chapter's title, from its first heading ('# 03 · The encoder block' -> 'The encoder block')."""
    for source in course_map.markdown_cells(path):
        match = re.search(r"^# (?:\d+\s*·\s*)?(.+)$", source, re.M)
        if match:
            return match.group(1).strip()
    return path.stem


def table(root=ROOT):
    """The README's table (markdown lines)."""
    plan = course_map.plan_of_index((root / "book" / "index.md").read_text(encoding="utf-8"))
    chapters = [(path.name[:2], title(path), path) for path in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))]
    return course_map.markdown_rows(chapters, plan)


def readme_with_table(text, root=ROOT):
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + "\n" + "\n".join(table(root)) + "\n" + END + rest.split(END, 1)[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's course table is stale")
    args = parser.parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = readme_with_table(text)
    if args.check:
        if new != text:
            print("README.md's course table is stale: run `python -m tools.course_map`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
