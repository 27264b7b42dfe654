"""Each chapter is one whole story, measured from outside on every chapter.

- Whole: in every student notebook the sections ("## 3. ...") and exercises ("### Exercise 4.2: ...") are
  numbered without gaps, every exercise stub (a code cell raising `NotImplementedError`) comes after its own
  statement, and there are as many statements as stubs.
- One story: the main text (markdown outside folded `<details>` boxes) names the machines and trials behind the
  course's recipes (CPU models, instruction sets, thread counts, machine loads, stand-in budgets, re-run seeds,
  benchmark scripts) at most 8 times, and at most 1,300 words come before the first exercise. That history
  lives in the book's appendix, book/recipes.md.

    python tests/test_chapters.py      # both counts for every chapter
"""

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.repo_text  # `make check-text`: the chapters' text, and the measures read on it
ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
STUDENTS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_MENTIONS, MAX_WORDS = 8, 1300

DETAILS = re.compile(r"<details\b.*?</details>", re.S | re.I)
MENTIONS = {  # what a chapter's main text should leave to the appendix
    "CPU model": r"\b(?:AMD\s+)?EPYC\b|\b(?:Intel(?:\(R\))?\s+)?Xeon\b|\bAMD\b|\bIntel\b|\bSapphire Rapids\b|\bRyzen\b",
    "instruction set": r"\bAVX[-‑]?(?:512|2)?(?:[ -]BF16)?\b|\bAMX\b|\bSSE\d?\b|\bNEON\b",
    "thread count": r"\bthreads?\b",
    "machine load": r"\bbusy\b|\bmachine's load\b|\bload(?:ed)? (?:of|at) \d|\bshared (?:virtual )?machine\b"
                    r"|\bwhat else (?:it|the machine) (?:is|was) doing\b",
    "stand-in": r"\bstand(?:s|ing)?[- ]ins?\b(?!\s+for\s+(?:the\s+|more\s+|roughly\s+)?(?:data|\w+\s+times))"
                r"|\bslow(?:est|er)\s+(?:2-core\s+)?machine",
    "re-run seed": r"\bseeds? \d+(?:,| and| to)|\b(?:two|three|four|five) seeds\b|\bran twice\b|\bre-?ran\b"
                   r"|--seeds\b|--runs\b",
    "benchmark script": r"\bbenchmarks/",
}
MENTION = re.compile("|".join(f"(?P<m{i}>{p})" for i, p in enumerate(MENTIONS.values())), re.I)
SECTION = re.compile(r"^## (?:(\d+)\. )?(.*)$")
UNNUMBERED = {"Learning goals", "Recap", "Going further"}
EXERCISE_LIKE = re.compile(r"^#{1,6}\s*Exercise\b", re.I)
EXERCISE = re.compile(r"^### Exercise (\d+)\.(\d+)(?: \(optional\))?: \S")
STUB = "raise NotImplementedError("


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def main_text(nb):
    """The chapter's markdown, cell after cell, without its folded `<details>` boxes."""
    return "\n".join(DETAILS.sub(" ", source(c)) for c in nb["cells"] if c["cell_type"] == "markdown")


def recipe_mentions(text):
    """Every phrase of `text` naming a machine, thread count, load, stand-in, re-run seed or benchmark script."""
    return [m.group(0) for m in MENTION.finditer(text)]


def words_before_first_exercise(text):
    """Words (whitespace-separated) of `text` before its first "### Exercise" heading (all, if it has none)."""
    first = text.find("### Exercise")
    return len((text if first < 0 else text[:first]).split())


def structure_problems(nb, chapter):
    """What breaks the chapter's numbering or leaves a stub without its statement; [] when whole.

    Sections: "## N. Title" with N = 1, 2, ... (plus "## Learning goals", "## Recap", "## Going further").
    Exercises: "### Exercise C.k: name ..." (or "### Exercise C.k (optional): name ...") with C the chapter and
    k = 1, 2, ...; each is followed by exactly one stub before the next exercise or section.
    """
    problems, sections, exercises, stubs = [], 0, 0, 0
    pending = None  # the statement whose stub has not come yet
    for i, cell in enumerate(nb["cells"]):
        text = source(cell)
        if cell["cell_type"] == "code":
            if STUB in text:
                stubs += 1
                if pending is None:
                    problems.append(f"cell {i}: an exercise stub with no statement before it: {text.splitlines()[0]!r}")
                pending = None
            continue
        if cell["cell_type"] != "markdown":
            continue
        for line in text.splitlines():
            if line.startswith("## "):
                number, title = SECTION.match(line).groups()
                if number is None and title.strip() not in UNNUMBERED:
                    problems.append(f"cell {i}: section without a number: {line!r}")
                elif number is not None:
                    sections += 1
                    if int(number) != sections:
                        problems.append(f"cell {i}: section {number} where section {sections} was due: {line!r}")
                        sections = int(number)
                if pending is not None:
                    problems.append(f"cell {i}: Exercise {pending} has no stub before the next section {line!r}")
                    pending = None
            elif EXERCISE_LIKE.match(line):
                match = EXERCISE.match(line)
                if not match:
                    problems.append(f"cell {i}: exercise heading not of the form '### Exercise {chapter}.k: name': "
                                    f"{line!r}")
                    continue
                exercises += 1
                if (int(match[1]), int(match[2])) != (chapter, exercises):
                    problems.append(f"cell {i}: Exercise {match[1]}.{match[2]} where Exercise {chapter}.{exercises}"
                                    f" was due")
                    exercises = int(match[2])
                if pending is not None:
                    problems.append(f"cell {i}: Exercise {pending} has no stub before Exercise {match[1]}.{match[2]}")
                pending = f"{match[1]}.{match[2]}"
    if pending is not None:
        problems.append(f"Exercise {pending} has no stub")
    statements = sum(1 for c in nb["cells"] if c["cell_type"] == "markdown"
                     for line in source(c).splitlines() if EXERCISE.match(line))
    if statements != stubs:
        problems.append(f"{statements} exercise statements for {stubs} stubs")
    return problems


def chapter_number(path):
    return int(Path(path).name[:2])


# ---- the rules, on hand-made chapters -----------------------------------------------------------------------

def md(text):
    return {"cell_type": "markdown", "source": text}


def code(text):
    return {"cell_type": "code", "source": text}


WHOLE = [md("# 08 · Title\n\n## Learning goals"), md("## 1. One\n\n### Exercise 8.1: f (★☆☆, ~5 min)"),
         code("def f(x):\n    raise NotImplementedError(\"f\")"), code("checks.f(f)"),
         md("## 2. Two"), md("### Exercise 8.2 (optional): g (★☆☆, ~5 min)"), code("def g():\n    pass"),
         code("def g(x):\n    raise NotImplementedError(\"g\")"), md("## Recap\n\n## Going further")]


def test_a_whole_chapter_passes():
    assert structure_problems({"cells": WHOLE}, 8) == []


@pytest.mark.parametrize("broken, expected", [
    # fb08518's chapter 08: a stub kept, its section and statement dropped, the numbers left with gaps
    (WHOLE[:4] + [md("## 3. Three"), code("def h(x):\n    raise NotImplementedError(\"h\")"),
                  md("### Exercise 8.3: k (★☆☆)"), code("raise NotImplementedError(\"k\")")],
     ["no statement before it", "section 3 where section 2 was due", "Exercise 8.3 where Exercise 8.2 was due",
      "2 exercise statements for 3 stubs"]),
    (WHOLE[:2] + WHOLE[4:], ["Exercise 8.1 has no stub before the next section", "2 exercise statements for 1 stubs"]),
    ([md("## 1. One\n\n### Exercise 7.1: f")] + WHOLE[2:], ["Exercise 7.1 where Exercise 8.1 was due"]),
    ([md("## One\n\n### Exercise: f (★☆☆)")] + WHOLE[2:], ["section without a number", "exercise heading not of"]),
])
def test_a_broken_chapter_names_what_breaks_it(broken, expected):
    problems = "\n".join(structure_problems({"cells": broken}, 8))
    for part in expected:
        assert part in problems, problems


def test_the_measures_count_what_they_should():
    text = ("On the AMD EPYC (AVX-512 BF16) with 2 threads, the slowest machine's stand-in fitted 9 epochs; "
            "`benchmarks/ablate.py` with seeds 0, 1 and 2 on a busy machine.\n<details>Intel Xeon, AMX</details>")
    assert recipe_mentions(DETAILS.sub(" ", text)) == ["AMD EPYC", "AVX-512 BF16", "threads", "slowest machine",
                                                       "stand-in", "benchmarks/", "seeds 0,", "busy"]
    assert recipe_mentions("Augmentation can stand in for data, or for roughly ten times more data.") == []
    assert words_before_first_exercise("one two\n### Exercise 1.1: x\nthree") == 2
    assert words_before_first_exercise("no exercise here") == 3


# ---- the course's chapters ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_student_notebook_is_whole(path):
    problems = structure_problems(json.loads(path.read_text(encoding="utf-8")), chapter_number(path))
    assert problems == [], f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_chapter_tells_its_story_not_the_recipes_history(path):
    text = main_text(json.loads(path.read_text(encoding="utf-8")))
    mentions = recipe_mentions(text)
    assert len(mentions) <= MAX_MENTIONS, (
        f"{path.name}: {len(mentions)} mentions of machines, seeds or benchmarks outside <details> (at most "
        f"{MAX_MENTIONS}): {mentions}; move them to book/recipes.md or a folded box")
    words = words_before_first_exercise(text)
    assert words <= MAX_WORDS, f"{path.name}: {words} words before the first exercise (at most {MAX_WORDS})"


def test_chapter_08_stays_at_its_core():
    """Chapter 08 keeps the paper's findings and their tests (about 60 cells); the course's own study of what makes
    a head local is the optional page book/heads_study.md, which the chapter links."""
    nb = json.loads((ROOT / "solutions" / "08_what_vit_learns.ipynb").read_text(encoding="utf-8"))
    sections = [line for cell in nb["cells"] if cell["cell_type"] == "markdown"
                for line in source(cell).splitlines() if SECTION.match(line)]
    assert len(nb["cells"]) <= 60, f"chapter 08 has {len(nb['cells'])} cells (at most about 60)"
    assert not any("what makes a head local" in line.lower() for line in sections), sections
    assert "](../book/heads_study.md)" in main_text(nb)


def test_every_chapter_is_measured():
    assert [p.name for p in STUDENTS] == [p.name for p in SOLUTIONS] and len(SOLUTIONS) == 9


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or SOLUTIONS
    print(f"{'chapter':<28} {'mentions':>8} {'words before the first exercise':>32}")
    for path in paths:
        text = main_text(json.loads(path.read_text(encoding="utf-8")))
        print(f"{path.stem:<28} {len(recipe_mentions(text)):>8} {words_before_first_exercise(text):>32}")
