"""The machinery every check shares (vit_course/checks/core.py and messages.py): a failure says what was tried and
where the learner's code raised, a check leaves the global RNG alone, IPython shows the message alone, values are
described in one short line.
"""

import math
import re

import pytest
import torch
from torch import nn

import vit_course as ref
from vit_course import checks
from vit_course.checks import CheckFailed


def test_failure_says_what_was_tried():
    with pytest.raises(CheckFailed) as info:
        checks.scaled_dot_product_attention(checks.ch01_self_attention.SLIPS[0].impl)
    message = str(info.value)
    assert message.startswith("scaled_dot_product_attention: wrong")
    assert "tried: sdpa_no_scale(tensor(5, 6), tensor(7, 6), tensor(7, 3))" in message  # the function's own name
    assert "expected" in message and "likely cause" in message


def test_learner_error_names_the_line():
    def broken(q, k, v, mask=None):
        scores = q @ k  # forgot the transpose
        return scores, scores

    with pytest.raises(CheckFailed, match=r"raised RuntimeError.*\n  at line \d+ of your code: scores = q @ k(.|\n)*"
                       r"likely cause: the scores are q times the keys with their last two axes swapped"):
        checks.scaled_dot_product_attention(broken)


@pytest.mark.parametrize("learner, says", [(None, "expected your SelfAttention (a function or class), got None"),
                                           (ref.SelfAttention(4, 4), "expected your class SelfAttention itself")])
def test_a_check_says_what_it_got_instead_of_the_learners_code(learner, says):
    with pytest.raises(CheckFailed, match=re.escape(says)):
        checks.SelfAttention(learner)


def test_check_leaves_the_global_rng_alone(capsys):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    checks.scaled_dot_product_attention(ref.scaled_dot_product_attention)
    assert torch.equal(torch.rand(3), expected)


def test_ipython_shows_the_message_alone():
    error = CheckFailed("split_heads: wrong")
    assert isinstance(error, AssertionError)
    assert error._render_traceback_() == ["\x1b[0;31mCheckFailed\x1b[0m: split_heads: wrong"]


def test_describe_gives_one_short_line():
    from vit_course.checks.messages import describe

    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    assert describe(optimizer) == "SGD(lr=0.5, momentum=0.9)"
    assert describe(torch.optim.AdamW(model.parameters(), lr=1e-3)).startswith("AdamW(lr=0.001, betas=(0.9, 0.999)")
    assert describe(model) == "Linear(in_features=3, out_features=2, bias=True)"
    assert describe(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == "Sequential"
    assert describe(torch.zeros(2, 3, dtype=torch.long)) == "int64 tensor(2, 3)"
    assert describe(torch.zeros(2) > 0) == "bool tensor(2,)"
    assert describe((4, 4)) == "(4, 4)" and describe([]) == "[]"
    assert describe([torch.zeros(2)] * 6) == "list of 6 tensors (2,)"
    assert describe(x for x in ()) == "a generator" and describe(math.sqrt) == "function sqrt"
    assert describe(ref.SelfAttention) == "class SelfAttention"
    for value in (optimizer, "x" * 100, {"a": torch.zeros(50, 50)}, ref.ViT(image_size=8, patch_size=4, dim=8,
                                                                            depth=1, num_heads=2, num_classes=2)):
        assert "\n" not in describe(value) and len(describe(value)) <= 80


def test_tried_line_is_one_short_line():
    with pytest.raises(CheckFailed) as info:
        checks.train_step(checks.ch06_train_mnist.SLIPS_OF["sum"].impl)
    tried = [line for line in str(info.value).split("\n") if line.startswith("  tried:")]
    assert tried == ["  tried: train_step(Probe, tensor(8, 3, 2, 2), int64 tensor(8,), SGD(lr=0.5, momentum=0.9))"]
