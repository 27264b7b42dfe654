"""Shared by the checks' own tests: a check must reject a wrong implementation with the right hint."""

import pytest

from vit_course.checks import CheckFailed


def rejects(check, impl, hint):
    """``check(impl)`` must fail, and its message must match the regex ``hint``."""
    with pytest.raises(CheckFailed, match=hint):
        check(impl)


def accepts(check, impl, capsys):
    """``check(impl)`` must pass and print its one success line."""
    check(impl)
    out = capsys.readouterr().out
    assert out.startswith(f"✔ {check.__name__}: passed") and out.count("\n") == 1
