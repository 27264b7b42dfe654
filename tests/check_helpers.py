"""Shared by the checks' own tests: a check must reject a slip under the rule it breaks and accept correct variants."""

import pytest

from vit_course.checks import CheckFailed


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
