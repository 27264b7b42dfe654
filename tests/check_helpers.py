"""Shared by the checks' own tests: a check must reject a wrong implementation with the right hint (and, in the
catalogues of slips, name the rule of the exercise it breaks) and accept correct variants."""

from dataclasses import dataclass

import pytest

from vit_course import checks
from vit_course.checks import CheckFailed


def rejects(check, impl, hint, rule=None):
    """``check(impl)`` must fail, its message must match the regex ``hint`` and, if given, name the rule ``rule``."""
    with pytest.raises(CheckFailed, match=hint) as info:
        check(impl)
    if rule is not None:
        assert info.value.rule == rule, f"the check blamed rule {info.value.rule!r}, not {rule!r}:\n{info.value}"


def fails(check, impl, rule):
    """``check(impl)`` must fail, blaming the rule ``rule``; -> the CheckFailed."""
    with pytest.raises(CheckFailed) as info:
        check(impl)
    assert info.value.rule == rule, f"the check blamed rule {info.value.rule!r}, not {rule!r}:\n{info.value}"
    return info.value


def accepts(check, impl, capsys):
    """``check(impl)`` must pass and print its one success line, the same however many tests it ran."""
    check(impl)
    assert capsys.readouterr().out == f"✔ {check.__name__}: passed\n"


@dataclass(frozen=True)
class Slip:
    """A learner's slip that the statement of exercise ``check`` forbids: ``checks.<check>(impl)`` must fail with a
    message matching ``hint`` and blame ``rule`` (a key of its record's RULES, "inputs" for an input
    changed in place, None for an exercise not done yet)."""

    check: str
    rule: str
    impl: object
    hint: str
    name: str


def slip(check, rule, name, impl, hint):
    return Slip(check, rule, impl, hint, name)


def caught(entry):
    rejects(getattr(checks, entry.check), entry.impl, entry.hint, entry.rule)


def catalogue_ids(entries):
    return [f"{e.check}-{e.rule}-{e.name}" for e in entries]
