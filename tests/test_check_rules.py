"""One list of rules per exercise (``RULES`` in its chapter's record, vit_course/checks/chNN_*.py), held by structure,
not by prose: the exercises with a list are the exercises the notebooks state (their headings, "### Exercise N.M:
name", are the stable anchors), a check tests exactly its exercise's rules, and every rule has a slip in the records'
catalogue that the check rejects under that rule (tests/test_checks_catalogue.py feeds them)."""

import re
from pathlib import Path

import nbformat
import pytest

import vit_course
import vit_course.train
from vit_course import checks
from vit_course.checks import COURSE_RULES, RULES

ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^### Exercise [\d.]+(?: \(optional\))?: (\w+)", re.M)


def stated():
    """The exercises the solution notebooks state, by their headings."""
    return {name for path in sorted((ROOT / "solutions").glob("0[1-9]_*.ipynb"))
            for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"
            for name in HEADING.findall(cell.source)}


def reference(name):
    return getattr(vit_course, name, None) or getattr(vit_course.train, name)


def test_every_stated_exercise_has_its_list_of_rules():
    assert stated() == set(RULES)
    assert all(RULES[name] for name in RULES)


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_check_tests_exactly_its_rules(name, capsys):
    check = getattr(checks, name)
    check(reference(name))
    assert check.rules_seen <= set(RULES[name]) | set(COURSE_RULES), check.rules_seen - set(RULES[name])
    assert set(RULES[name]) <= check.rules_seen, set(RULES[name]) - check.rules_seen


# the exercises whose inputs are numbers, or a function
NO_TENSOR_INPUTS = {"count_parameters", "split_is_correct", "warmup_cosine", "sincos_position_embedding"}


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_has_a_slip_in_the_catalogue(name):
    broken = {slip.rule for slip in checks.SLIPS if slip.exercise == name}
    rules = list(RULES[name]) + ([] if name in NO_TENSOR_INPUTS else list(COURSE_RULES))
    missing = [rule for rule in rules if rule not in broken]
    assert not missing, f"{name}: no slip in the catalogue breaks {missing}"
