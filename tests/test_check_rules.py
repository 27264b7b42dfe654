"""One list of rules per exercise (``RULES`` in its chapter's record, vit_course/checks/chNN_*.py), held to both
sides: every rule is stated in its exercise's statement, a check tests exactly its exercise's rules, and every rule
has a wrong variant in the checks' own tests that the check rejects, naming that rule."""

import re
from pathlib import Path

import nbformat
import pytest

import vit_course
import vit_course.train
from tools import notebooks
from vit_course import checks
from vit_course.checks import COURSE_RULES, RULES

from . import (
    test_checks_ch05_vision_transformer,
)
from .check_helpers import catalogue_ids, caught

ROOT = Path(__file__).resolve().parents[1]
CATALOGUES = [test_checks_ch05_vision_transformer]  # their SLIPS
SLIPS = [entry for module in CATALOGUES for entry in module.SLIPS]


def flat(text):
    return " ".join(text.split())


def statements():
    """{exercise: its statement} from the solution notebooks: from the exercise's heading to its code cell (the
    student's version of the code cells, so the stub's docstring counts, the solution does not)."""
    found = {}
    for path in sorted((ROOT / "solutions").glob("0[1-79]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        start = None
        for index, cell in enumerate(nb.cells):
            heading = re.search(r"^### Exercise [\d.]+(?: \(optional\))?: (\w+)", cell.source, re.M)
            if cell.cell_type == "markdown" and heading:
                start, name, parts = index, heading.group(1), [cell.source[heading.start():]]
                continue
            if start is None:
                continue
            if cell.cell_type == "markdown":
                parts.append(cell.source)
                continue
            parts.append(notebooks.strip_solutions(cell.source)[0])
            if "### BEGIN SOLUTION" in cell.source:
                found[name], start = flat("\n".join(parts)), None
    return found


STATEMENTS = statements()
CHECKS_INTRO = flat(nbformat.read(ROOT / "solutions" / "01_self_attention.ipynb", as_version=4).cells[17].source)


def reference(name):
    return getattr(vit_course, name, None) or getattr(vit_course.train, name)


def test_every_exercise_of_chapters_01_to_07_and_09_has_its_list():
    assert set(STATEMENTS) == set(RULES)


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_is_stated(name):
    missing = [rule for rule, words in RULES[name].items() if flat(words) not in STATEMENTS[name]]
    assert not missing, f"{name}: rules {missing} are not in the statement"
    for rule, words in COURSE_RULES.items():
        assert flat(words) in CHECKS_INTRO, rule


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_check_tests_exactly_its_rules(name, capsys):
    check = getattr(checks, name)
    check(reference(name))
    assert check.rules_seen <= set(RULES[name]) | set(COURSE_RULES), check.rules_seen - set(RULES[name])
    assert set(RULES[name]) <= check.rules_seen, set(RULES[name]) - check.rules_seen


def slips():
    """{exercise: {rule: number of wrong variants rejected under it}} from the catalogues of the checks' tests."""
    found = {}
    for entry in SLIPS + checks.SLIPS:  # the tests' catalogues and the records' (Slip.exercise)
        name = getattr(entry, "exercise", None) or entry.check
        found.setdefault(name, {}).setdefault(entry.rule, 0)
        found[name][entry.rule] += 1
    return found


NO_TENSOR_INPUTS = {"count_parameters", "warmup_cosine"}  # the exercises whose inputs are numbers


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_has_a_rejected_slip(name):
    caught = slips().get(name, {})
    rules = list(RULES[name]) + ([] if name in NO_TENSOR_INPUTS else list(COURSE_RULES))
    missing = [rule for rule in rules if rule not in caught]
    assert not missing, f"{name}: no wrong variant in the catalogue breaks {missing}"


@pytest.mark.parametrize("entry", SLIPS, ids=catalogue_ids(SLIPS))
def test_every_slip_of_the_catalogue_is_caught_with_its_rule(entry):
    caught(entry)
