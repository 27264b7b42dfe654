"""The records' catalogues (``SLIPS`` and ``VARIANTS`` in vit_course/checks/chNN_*.py), fed to their checks: every slip
is rejected under its rule with its hint, every variant passes with the one success line."""

import pytest
import torch

from vit_course import checks

from .check_helpers import accepts, fails


@pytest.mark.parametrize("slip", checks.SLIPS, ids=[f"{s.exercise}-{s.rule}-{s.name}" for s in checks.SLIPS])
def test_every_slip_is_rejected_with_its_hint(slip):
    failure = fails(getattr(checks, slip.exercise), slip.impl, slip.rule)
    assert torch.is_grad_enabled(), "a check leaves the grad mode as it found it"
    if failure.slip is not None:  # the check named a slip of its record (passed it, or its very hint object): this
        # one, or one it cannot tell apart (the same hint)
        assert failure.slip is slip or failure.slip.hint is slip.hint, f"named {failure.slip.name}:\n{failure}"
    else:  # a hint composed on the spot (a cut gradient's lines, a stub): it holds the record's text
        assert slip.hint in str(failure), str(failure)


@pytest.mark.parametrize("variant", checks.VARIANTS, ids=[f"{v.exercise}-{v.name}" for v in checks.VARIANTS])
def test_every_variant_passes(variant, capsys):
    accepts(getattr(checks, variant.exercise), variant.impl, capsys)


def test_every_exercise_with_a_catalogue_has_a_slip_per_rule():
    exercises = {s.exercise for s in checks.SLIPS}
    for name in exercises & set(checks.RULES):
        missing = set(checks.RULES[name]) - {s.rule for s in checks.SLIPS if s.exercise == name}
        assert not missing, f"{name}: no slip breaks {missing}"
        assert any(v.exercise == name for v in checks.VARIANTS), name
