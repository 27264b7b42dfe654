"""Chapter 02's exercises: split_heads, split_is_correct (a test of split functions) and MultiHeadAttention (heads,
dropout in and out of training): checks and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import attention as ref
from .ch01_self_attention import random_mask
from .core import IN_PLACE, CheckFailed, Slip, Variant, check
from .gradients import CUT_AT, gradient_flow
from .messages import describe
from .modules import check_attention_weights, check_dropout, only_biases, twins
from .wiring import dropout_wiring

# ---- Exercise 2.1: split_heads
NO_TRANSPOSE = ("your heads look reshaped without a transpose: `.view(b, h, n, d)` mixes tokens and heads; "
                "reshape to (b, n, h, d) first, then transpose tokens and heads")
INTERLEAVED = ("your heads take every h-th feature: head i should own the i-th contiguous block of d features, "
               "(h d) in an einops pattern, not (d h)")
HEAD_AXIS = ("this is (b, n, h, d): move the head axis in front of the tokens (transpose(1, 2)), the result is (b, h, "
             "n, d)")
HEADS_AS_WIDTH = ("num_heads was used as the width of a head: the pattern's h is num_heads, and einops works out d = "
                  "width // num_heads")
SPLIT_CASES = ((2, 5, 12, 3), (1, 1, 6, 2), (3, 7, 15, 5), (2, 4, 8, 1), (2, 3, 8, 8))


@check("split_heads")
def split_heads(c, fn):
    """(b, n, D) -> (b, h, n, d): head i owns the i-th contiguous block of d features; gradients reach x."""
    g = torch.Generator().manual_seed(3)
    for b, n, width, h in SPLIT_CASES:
        x = torch.randn(b, n, width, generator=g)
        d = width // h
        c.close(c.call(fn, x, h), ref.split_heads(x, h), f"split into {h} heads", c.named(c.slips("output"), x, h),
                shape_hints=[((b, n, h, d), HEAD_AXIS), ((b, d, n, h), HEADS_AS_WIDTH)])
    gradient_flow(c, fn, lambda t: c.call(fn, t["x"], 3), lambda t: ref.split_heads(t["x"], 3),
                  dict(x=torch.randn(2, 4, 12, generator=g)))


def split_heads_view_no_transpose(x, num_heads):
    b, n, _ = x.shape
    return x.view(b, num_heads, n, -1)  # (b, h, n, d) by shape only: tokens and heads mixed


def split_heads_interleaved(x, num_heads):
    return rearrange(x, "b n (d h) -> b h n d", h=num_heads)  # head i gets every h-th feature


def split_heads_not_moved(x, num_heads):
    return rearrange(x, "b n (h d) -> b n h d", h=num_heads)  # (b, n, h, d): the heads still behind the tokens


def split_heads_heads_as_width(x, num_heads):
    return rearrange(x, "b n (h d) -> b h n d", d=num_heads)  # d and h swapped: heads num_heads wide


def split_heads_detached(x, num_heads):
    return rearrange(x.detach(), "b n (h d) -> b h n d", h=num_heads)  # the graph is cut: no gradient reaches x


def split_heads_in_place(x, num_heads):
    return x.unsqueeze_(0)[0].unflatten(-1, (num_heads, -1)).transpose(1, 2)  # unsqueeze_ changes the caller's x


def split_heads_unflatten(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def split_heads_view_permute(x, num_heads):
    b, n, width = x.shape
    return x.view(b, n, num_heads, width // num_heads).permute(0, 2, 1, 3)


# ---- Exercise 2.2: split_is_correct, a test: it must say True to correct splits and False to wrong ones
REJECTS_CORRECT = ("your test rejects (or raises on) a correct split: the tokens are axis 2 of the split's (b, h, n, "
                   "d) (permute out[:, :, perm], not out[:, perm], which shuffles the heads), and a split only moves "
                   "values, so compare with torch.equal values that came out of x, not results of float arithmetic")
LAYOUT = ("your test rejects a correct split that differs from another only in memory (a view of x or a copy, "
          "contiguous or not): test values and shapes, not strides, storage or contiguity")
RETURN_BOOL = "return True or False: a function without a `return` statement returns None"
VIEW_PASSED = ("your test passes the `.view` bug (right shape, tokens and heads mixed): permute the tokens of x and "
               "ask for the split's token axis permuted the same way, or ask head i to hold block i of every token")
FEATURES_FIRST_PASSED = ("your test passes a split that reshapes (b, D, n) into (b, h, n, d) (head i gets the right "
                         "features, but in the wrong places): ask for the values too, not only which head changes, or "
                         "test that permuting the tokens permutes the split's token axis")
WRONG_HEADS_PASSED = ("your test passes a split that gives head i the wrong features (every h-th feature, or another "
                      "head's block): ask head i to hold the i-th block of d features, on an input whose values "
                      "label their places (torch.arange)")
SHAPE_FIRST = ("your test raised instead of returning False on a split of the wrong shape: compare the shape with "
               "(b, h, n, d) first, and return False before indexing")
WRONG_SHAPE_PASSED = ("your test passes a split of the wrong shape: ask for (b, h, n, d) exactly, with b, h, n and d "
                      "all different, so no axis passes for another")
SQUARE_PASSED = ("your test passes a split that uses num_heads as the width of a head: it gives the right answer "
                 "only when d == h; test with d different from h")
BATCH_PASSED = ("your test passes a split that mixes the images of a batch: it gives the right answer for a batch "
                "of one; test with two images or more")


def split_heads_features_first(x, num_heads):
    b, n, width = x.shape
    return x.transpose(1, 2).reshape(b, num_heads, n, -1)  # (b, D, n) read as (b, h, n, d)


def split_heads_reversed(x, num_heads):
    return ref.split_heads(x, num_heads).flip(1)  # head 0 gets the last block


def split_heads_mixing_images(x, num_heads):
    b, n, width = x.shape
    return x.reshape(b * n, num_heads, -1).transpose(0, 1).reshape(b, num_heads, n, -1)  # right for b = 1 only


def split_heads_copy(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2).contiguous()


def split_heads_stack(x, num_heads):
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


CORRECT_SPLITS = (split_heads_copy, ref.split_heads, split_heads_stack, split_heads_view_permute)
WRONG_SPLITS = {  # rule -> (wrong split, the hint when a test passes it)
    "tokens": ((split_heads_view_no_transpose, VIEW_PASSED), (split_heads_features_first, FEATURES_FIRST_PASSED)),
    "heads": ((split_heads_interleaved, WRONG_HEADS_PASSED), (split_heads_reversed, WRONG_HEADS_PASSED)),
    "sizes": ((split_heads_not_moved, WRONG_SHAPE_PASSED), (split_heads_heads_as_width, SQUARE_PASSED),
              (split_heads_mixing_images, BATCH_PASSED)),
}


def _verdict(c, test, split, raised_on=None, hint=None):
    """The learner's test run on ``split``: True or False (a one-element bool tensor counts). ``raised_on``: what
    ``split`` is, for the message when the test raises on it, with ``hint`` (None: the error's own likely cause)."""
    try:
        got = c.call(test, split, label="split_is_correct")
    except CheckFailed as failure:
        if raised_on is None or "your code raised " not in str(failure):
            raise
        raised = str(failure).split("your code raised ", 1)[1].split("\n")[0]
        c.fail(f"on {split.__name__}, {raised_on}, your test raised {raised}", hint)
    if torch.is_tensor(got) and got.numel() == 1 and got.dtype == torch.bool or type(got).__name__ == "bool_":
        got = bool(got)  # a one-element tensor of torch.equal's kind, or numpy's bool
    if not isinstance(got, bool):
        c.fail(f"split_is_correct({split.__name__}) returned {describe(got)}, expected True or False",
               RETURN_BOOL if got is None else "return a bool: torch.equal(a, b) gives one")
    return got


@check("split_is_correct")
def split_is_correct(c, test):
    """split_is_correct(split_fn) -> bool: True for correct splits (copies, views, stacks), False for wrong ones:
    tokens mixed (the `.view` bug), heads given the wrong features, a wrong shape or a split right only at some
    sizes; a wrong split gives False, not an exception."""
    c.phase("correct")
    for i, split in enumerate(CORRECT_SPLITS):
        hint = REJECTS_CORRECT if i == 0 else LAYOUT  # the first one rejected: the test; a later one: its layout
        c.ok(_verdict(c, test, split, "a correct split", hint) is True,
             f"your test returned False for a correct split, {split.__name__}", hint)
    for rule, splits in WRONG_SPLITS.items():
        c.phase(rule)
        for split, hint in splits:
            shape = tuple(split(torch.zeros(2, 5, 12), 3).shape)  # (b, h, n, d) = (2, 3, 5, 4) when right
            wrong_shape = f"a wrong split whose output is {shape}" if shape != (2, 3, 5, 4) else None
            verdict = _verdict(c, test, split, wrong_shape, SHAPE_FIRST)
            c.ok(verdict is False, f"your test returned True for a wrong split, {split.__name__}", hint)


def test_shape_only(split_fn):
    x = torch.randn(2, 5, 12)  # (b, n, D)
    return tuple(split_fn(x, 3).shape) == (2, 3, 5, 4)


def test_heads_axis_permuted(split_fn):
    x, perm = torch.randn(2, 5, 12), torch.randperm(5)  # (b, n, D), a token order
    out = split_fn(x, 3)  # (b, h, n, d)
    return out.shape == (2, 3, 5, 4) and torch.equal(split_fn(x[:, perm], 3), out[:, perm])  # axis 1: the heads


def test_contiguous_required(split_fn):
    return ref.split_is_correct(split_fn) and split_fn(torch.randn(2, 5, 12), 3).is_contiguous()


def test_no_return(split_fn):
    ref.split_is_correct(split_fn)  # computed, never returned


def test_head_changes_only(split_fn):
    """Changing head i's block of x changes head i of the split, all of it, and nothing else; no value test."""
    x = torch.randn(2, 5, 12)  # (b, n, D)
    out = split_fn(x, 3)
    if out.shape != (2, 3, 5, 4):
        return False
    for i in range(3):
        y = x.clone()
        y[..., 4 * i:4 * (i + 1)] += 1.0
        changed = split_fn(y, 3) != out  # (b, h, n, d)
        if not changed[:, i].all() or changed.sum() != changed[:, i].sum():
            return False
    return True


def test_permutation_only(split_fn):
    x, perm = torch.randn(2, 5, 12), torch.tensor([3, 0, 4, 1, 2])  # (b, n, D), a token order
    out = split_fn(x, 3)
    return out.shape == (2, 3, 5, 4) and torch.equal(split_fn(x[:, perm], 3), out[:, :, perm])


def test_no_shape_check(split_fn):
    b, n, h, d = 2, 5, 3, 4
    x, perm = torch.arange(b * n * h * d).reshape(b, n, h * d), torch.tensor([3, 0, 4, 1, 2])
    out = split_fn(x, h)
    if not torch.equal(split_fn(x[:, perm], h), out[:, :, perm]):  # an IndexError when out is (b, n, h, d)
        return False
    return all(torch.equal(out[:, i], x[:, :, i * d:(i + 1) * d]) for i in range(h))


def test_square_heads(split_fn):
    b, n, h, d = 2, 5, 3, 3  # d == h
    x = torch.arange(b * n * h * d).reshape(b, n, h * d)
    out = split_fn(x, h)
    return out.shape == (b, h, n, d) and all(torch.equal(out[:, i], x[:, :, i * d:(i + 1) * d]) for i in range(h))


def test_one_image(split_fn):
    b, n, h, d = 1, 5, 3, 4  # a batch of one
    x = torch.arange(b * n * h * d).reshape(b, n, h * d)
    out = split_fn(x, h)
    return out.shape == (b, h, n, d) and all(torch.equal(out[:, i], x[:, :, i * d:(i + 1) * d]) for i in range(h))


def test_by_values(split_fn):
    """Shape and values, no permutation: on a labelled input, the values pin the split down."""
    x = torch.arange(2 * 5 * 12).reshape(2, 5, 12)  # (b, n, D)
    out = split_fn(x, 3)
    return tuple(out.shape) == (2, 3, 5, 4) and all(torch.equal(out[:, i], x[..., 4 * i:4 * (i + 1)])
                                                    for i in range(3))


def test_float_allclose(split_fn):
    """Random floats, torch.allclose, and a tensor (not a bool) returned: the statement allows all three."""
    x = torch.randn(3, 7, 10)  # (b, n, D), b=3, n=7, h=2, d=5
    out = split_fn(x, 2)
    if out.shape != (3, 2, 7, 5):
        return torch.tensor(False)
    perm = torch.randperm(7)
    heads = torch.tensor([torch.allclose(out[:, i], x[..., 5 * i:5 * (i + 1)]) for i in range(2)])
    return torch.tensor(torch.allclose(split_fn(x[:, perm], 2), out[:, :, perm])) & heads.all()


# ---- Exercise 2.3: MultiHeadAttention
ORDER = ("the qkv output is split in the wrong order: it is laid out [q | k | v], each then split into heads, "
         "the pattern 'b n (three h d)'")
QKV_INTERLEAVED = ("the heads take every h-th feature of q, k and v: each head owns a contiguous block of d, "
                   "'(three h d)', not '(three d h)'")
QKV_VIEW = ("q, k and v look reshaped into heads without a transpose: `.reshape(b, h, n, d)` of (b, n, D) mixes "
            "tokens and heads; the (three h d) features must be split off the last axis, then the heads moved in "
            "front of the tokens")
BY_DIM_HEAD = "the scores are scaled by 1/sqrt(dim): use the width of one head, 1/sqrt(head_dim)"
NO_SCALE = "the scores are not scaled: divide q k^T by sqrt(head_dim) (F.scaled_dot_product_attention does it)"
SOFTMAX_AXIS = ("softmax over the wrong axis: each query's weights must sum to 1 over the keys, the last axis "
                "(dim=-1)")
MERGED_VIEW = ("your heads are merged without a transpose: bring the tokens back in front of the heads ('b h n d -> b "
               "n (h d)') before flattening")
NO_PROJ = "the output projection `proj` seems to be missing after merging the heads"
VALUES_FROM = "the values are taken from q (or k): attend over v, the third part of qkv's output"
MASK_IGNORED = "the mask seems to be ignored: pass it on, F.scaled_dot_product_attention(..., attn_mask=mask)"
MASK_INVERTED = ("the mask looks inverted: True means 'may attend', the convention of F.scaled_dot_product_attention "
                 "(not of nn.MultiheadAttention, where True blocks)")
FUSED_QKV = "one fused Linear `qkv` (dim -> 3 * dim, with bias) makes q, k and v"
PROJ_NAME = "the output Linear is called `proj` (dim -> dim)"
PER_HEAD = "one (n, n) map per head: the weights are (b, h, n, n)"
WEIGHTS_REQUIRED = "attention_weights(x, mask=None) returning the (b, h, n, n) weights"
WEIGHTS_BY_DIM = ("attention_weights scales the scores by 1/sqrt(dim): a head's queries and keys are head_dim wide, "
                  "so the scale is 1/sqrt(head_dim), as in forward")
WEIGHTS_NO_SCALE = ("attention_weights does not scale the scores: divide q k^T by sqrt(head_dim) before the softmax, "
                    "as forward's fused kernel does (chapter 01's scaled_dot_product_attention does both)")
WEIGHTS_AXIS = ("attention_weights takes the softmax over the wrong axis: each query's weights sum to 1 over the keys, "
                "the last axis")
BIAS_IGNORED = "qkv_bias=False seems ignored: qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)"
QKV_BIAS = "qkv has no bias with the default qkv_bias=True: nn.Linear(dim, 3 * dim, bias=qkv_bias)"
PROJ_BIAS = ("proj has no bias: proj always has one (timm's Attention too); qkv_bias decides qkv's bias only, "
             "so proj = nn.Linear(dim, dim)")
HEAD_DIM = "self.head_dim = dim // num_heads, the width of one head"
NO_SPLIT = "write split_qkv(x) -> q, k, v as the exercise asks: forward and attention_weights both start with it"
WEIGHTS_DROPOUT = "attention_weights applies the attention dropout: return the weights themselves, without dropout"
ATTN_EVAL = ("attention dropout is applied in eval mode: pass dropout_p=self.attn_drop.p only while training, "
             "`self.attn_drop.p if self.training else 0.0`")
ATTN_TRAIN = ("attn_drop seems ignored: while training pass dropout_p=self.attn_drop.p to "
              "F.scaled_dot_product_attention")
PROJ_EVAL = ("the output dropout is applied in eval mode: use the module self.proj_drop (an nn.Dropout knows the "
             "mode), not F.dropout(out, p)")
PROJ_TRAIN = "proj_drop seems ignored: apply self.proj_drop after self.proj"
WHERE = {"attn_drop": ("on the attention weights (b, h, n, n)", "pass dropout_p=self.attn_drop.p to "
                       "F.scaled_dot_product_attention while training: it drops attention weights, not outputs"),
         "proj_drop": ("after proj, on the output (b, n, dim)", "return self.proj_drop(self.proj(merged heads))")}


def _bias_hints(qkv_bias):
    """``Checker.load`` hints for the biases (a missing or extra bias is a bias, not a name)."""
    return [(lambda missing, extra: only_biases(missing, extra) and "proj.bias" in missing, PROJ_BIAS),
            (lambda missing, extra: only_biases(missing, extra) and "qkv.bias" in (missing if qkv_bias else extra),
             QKV_BIAS if qkv_bias else BIAS_IGNORED)]


def reference_attention(m, x, mask=None):
    """The reference module's (out before proj (b, h, n, d), weights (b, h, n, n)), computed explicitly."""
    return ref.scaled_dot_product_attention(*m.split_qkv(x), mask)


def _weight_twins(slips, reference, args, x):
    """(slip, thunk) pairs: each slip's ``attention_weights`` with the reference's weights, on the learner's x."""
    def weights(slip):
        twin = slip.impl(*args).eval()
        twin.load_state_dict(reference.state_dict())
        return twin.attention_weights(x)
    return [(s, lambda s=s: weights(s)) for s in slips]


@check("MultiHeadAttention")
def MultiHeadAttention(c, cls):
    """MultiHeadAttention(dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0): timm's names and
    attributes, split_qkv with the (three h d) layout, forward through the fused kernel, attention_weights
    (b, h, n, n), dropout only while training, gradients reaching x and every layer."""
    g = torch.Generator().manual_seed(5)
    for dim, heads, batch, n in ((12, 3, 2, 7), (8, 1, 1, 4), (20, 5, 3, 9)):
        reference = ref.MultiHeadAttention(dim, heads).eval()
        model = c.build(cls, dim, heads)
        label = f"MultiHeadAttention({dim}, {heads})"
        c.load(model, reference, _bias_hints(True) + [("qkv", FUSED_QKV), ("proj", PROJ_NAME)])
        _attributes(c, model, label, dim, heads)
        x = torch.randn(batch, n, dim, generator=g)
        mask = random_mask((n, n), g)
        with torch.no_grad():
            _split_qkv(c, model, reference, x, label)
            c.phase("output")
            c.close(c.call(model, x, label=label), reference(x), "output",
                    twins(c.slips("output", "mask"), reference, (dim, heads), x))
            c.phase("mask")
            c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                    twins(c.slips("output", "mask"), reference, (dim, heads), x, mask=mask))
            _attention_weights(c, model, reference, x, mask, label)
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label), lambda t: reference(t["x"]),
                      dict(x=x), model, reference)
    _dropout(c, cls, g)
    c.phase("names")  # qkv_bias=False: a qkv without bias (proj keeps its own), the same output otherwise
    reference = ref.MultiHeadAttention(12, 3, qkv_bias=False).eval()
    model = c.load(c.build(cls, 12, 3, qkv_bias=False), reference, _bias_hints(False))
    x = torch.randn(2, 5, 12, generator=g)
    with torch.no_grad():
        c.close(c.call(model, x, label="MultiHeadAttention(12, 3, qkv_bias=False)"), reference(x),
                "output with qkv_bias=False")


def _attributes(c, model, label, dim, heads):
    """The attributes the statement asks __init__ to store."""
    c.attributes(model, label, [
        ("dim", dim, None), ("num_heads", heads, None),
        ("head_dim", dim // heads, HEAD_DIM),
        ("attn_drop", nn.Dropout, "self.attn_drop = nn.Dropout(attn_drop): forward reads its probability"),
        ("proj_drop", nn.Dropout, "self.proj_drop = nn.Dropout(proj_drop), applied after proj")])


def _split_qkv(c, model, reference, x, label):
    """split_qkv(x) -> q, k, v, each (b, h, n, d), the feature axis of qkv's output read as (three h d)."""
    c.phase("split_qkv")
    method = getattr(model, "split_qkv", None)
    if not callable(method):
        c.fail(f"{type(model).__name__} has no method split_qkv", NO_SPLIT)
    got = c.call(method, x, label=f"{label}.split_qkv")
    if torch.is_tensor(got) and got.ndim == 5 and len(got) == 3:  # (3, b, h, n, d): unpacks as q, k, v too
        got = got.unbind(0)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        c.fail(f"split_qkv should return three tensors q, k, v, got {type(got).__name__}",
               "`.unbind(0)` turns the (3, b, h, n, d) tensor into three")
    b, n, dim = x.shape
    h, d = reference.num_heads, reference.head_dim
    qkv = reference.qkv(x)  # (b, n, 3 dim)
    c.close(torch.stack([c.tensor(t, "q, k and v from split_qkv", (b, h, n, d)) for t in got]),
            torch.stack(reference.split_qkv(x)), "q, k and v from split_qkv", [
                (ORDER, lambda: rearrange(qkv, "b n (h three d) -> three b h n d", three=3, h=h)),
                (ORDER, lambda: rearrange(qkv, "b n (h d three) -> three b h n d", three=3, h=h)),
                (QKV_INTERLEAVED, lambda: rearrange(qkv, "b n (three d h) -> three b h n d", three=3, h=h)),
                (QKV_VIEW, lambda: qkv.reshape(b, n, 3, dim).permute(2, 0, 1, 3).reshape(3, b, h, n, d))])


def _attention_weights(c, model, reference, x, mask, label):
    """attention_weights(x, mask=None) -> (b, h, n, n), a slip in it named (a wrong scale, axis, one map)."""
    c.phase("attention_weights")
    weights = reference_attention(reference, x)[1]  # (b, h, n, n)
    b, n, dim = x.shape
    method = getattr(model, "attention_weights", None)
    if callable(method):
        c.close(c.call(method, x, label=f"{label}.attention_weights"), weights, "weights from attention_weights",
                _weight_twins(c.slips("attention_weights"), reference, (dim, reference.num_heads), x),
                shape_hints=[((b, n, n), PER_HEAD)])
    check_attention_weights(c, model, x, weights, label, mask, reference_attention(reference, x, mask)[1],
                            [((b, n, n), PER_HEAD)], required=WEIGHTS_REQUIRED)


def _dropout(c, cls, g):
    """Built with attn_drop (or proj_drop) = 0.5: the reference's output in eval mode, random while training."""
    c.phase("dropout")
    dim, heads = 12, 3
    x = torch.randn(2, 6, dim, generator=g)
    for key, eval_hint, train_hint in (("attn_drop", ATTN_EVAL, ATTN_TRAIN), ("proj_drop", PROJ_EVAL, PROJ_TRAIN)):
        reference = ref.MultiHeadAttention(dim, heads, **{key: 0.5}).eval()
        model = c.load(c.build(cls, dim, heads, **{key: 0.5}), reference)
        label = f"MultiHeadAttention({dim}, {heads}, {key}=0.5)"
        with torch.no_grad():
            check_dropout(c, model, x, reference(x), f"with {key}=0.5", eval_hint, train_hint, label)
        shape = (2, heads, 6, 6) if key == "attn_drop" else (2, 6, dim)
        dropout_wiring(c, model, reference, x, label, {(0.5, shape): f"{key}=0.5 {WHERE[key][0]}"}, WHERE[key][1])
        with torch.no_grad():
            if key == "attn_drop" and callable(getattr(model, "attention_weights", None)):
                model.train()
                try:
                    got = c.call(model.attention_weights, x, label=f"{label}.attention_weights in training mode")
                finally:
                    model.eval()
                c.ok(torch.is_tensor(got) and torch.allclose(got, reference_attention(reference, x)[1], atol=1e-5),
                     "in training mode (attn_drop=0.5) attention_weights does not give the weights of eval mode",
                     WEIGHTS_DROPOUT)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "split_heads": ("output", "gradient"),
    "split_is_correct": ("correct", "tokens", "heads", "sizes"),
    "MultiHeadAttention": ("attributes", "names", "split_qkv", "output", "mask", "attention_weights", "dropout",
                           "gradient"),
}


# ---- the MultiHeadAttention slips: each the reference with one thing wrong, written out
def _explicit(q, k, v, mask=None, scale=None, axis=-1):
    """softmax(q k^T * scale) v and the weights, as a learner writes them out (scale None: 1/sqrt(d))."""
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)  # (b, h, n, n)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=axis)
    return weights @ v, weights  # (b, h, n, d), (b, h, n, n)


class MHAQkvBiasIgnored(ref.MultiHeadAttention):
    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__(dim, num_heads, True, attn_drop, proj_drop)  # qkv always with a bias


class MHAQkvWithoutBias(ref.MultiHeadAttention):
    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__(dim, num_heads, False, attn_drop, proj_drop)  # qkv never with a bias


class MHAProjBiasFollowsQkvBias(ref.MultiHeadAttention):
    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop)
        self.proj = nn.Linear(dim, dim, bias=qkv_bias)  # proj's bias should not follow qkv_bias


class MHASeparateLayers(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))  # not one fused qkv


class MHANoHeadDim(ref.MultiHeadAttention):
    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop)
        del self.head_dim  # computed where needed, never stored


class MHASplitOrder(ref.MultiHeadAttention):
    def split_qkv(self, x):
        return rearrange(self.qkv(x), "b n (h three d) -> three b h n d", three=3, h=self.num_heads).unbind(0)


class MHANoSplitQkv(ref.MultiHeadAttention):
    split_qkv = None  # forward and attention_weights inline it instead

    def forward(self, x, mask=None):
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))

    def attention_weights(self, x, mask=None):
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return _explicit(q, k, v, mask)[1]


class MHAViewNoTranspose(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        b, n, dim = x.shape
        q, k, v = (t.reshape(b, self.num_heads, n, -1) for t in self.qkv(x).chunk(3, -1))  # tokens and heads mixed
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


class MHAMergeNoTranspose(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        b, n, dim = x.shape
        out = F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask)  # (b, h, n, d)
        return self.proj(out.reshape(b, n, dim))  # (b, h, n, d) read as (b, n, D): heads and tokens mixed


class MHAScaledByDim(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        out = _explicit(*self.split_qkv(x), mask, scale=1 / math.sqrt(self.dim))[0]  # sqrt(D), not sqrt(d)
        return self.proj(ref.merge_heads(out))


class MHANoScale(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        return self.proj(ref.merge_heads(_explicit(*self.split_qkv(x), mask, scale=1.0)[0]))


class MHASoftmaxOverQueries(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        return self.proj(ref.merge_heads(_explicit(*self.split_qkv(x), mask, axis=-2)[0]))


class MHANoProj(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        return ref.merge_heads(F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask))


class MHAForwardOrderHThreeD(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        q, k, v = rearrange(self.qkv(x), "b n (h three d) -> three b h n d", three=3, h=self.num_heads)
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


class MHAForwardOrderHDThree(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        q, k, v = rearrange(self.qkv(x), "b n (h d three) -> three b h n d", three=3, h=self.num_heads)
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


class MHAInterleaved(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        q, k, v = rearrange(self.qkv(x), "b n (three d h) -> three b h n d", three=3, h=self.num_heads)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (b, h, n, d)
        return self.proj(rearrange(out, "b h n d -> b n (d h)"))


class MHAValuesFromQ(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        q, k, v = self.split_qkv(x)
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, q, attn_mask=mask)))


class MHAValuesFromK(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        q, k, v = self.split_qkv(x)
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, k, attn_mask=mask)))


class MHAMaskIgnored(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(*self.split_qkv(x))))


class MHAMaskInverted(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        mask = None if mask is None else ~mask  # nn.MultiheadAttention's convention, True = blocked
        return self.proj(ref.merge_heads(F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask)))


class MHAWeightsMeanOverHeads(ref.MultiHeadAttention):
    def attention_weights(self, x, mask=None):
        return _explicit(*self.split_qkv(x), mask)[1].mean(1)  # (b, n, n): the heads averaged away


class MHAWeightsScaledByDim(ref.MultiHeadAttention):
    def attention_weights(self, x, mask=None):
        return _explicit(*self.split_qkv(x), mask, scale=1 / math.sqrt(self.dim))[1]  # sqrt(D), not sqrt(d)


class MHAWeightsNoScale(ref.MultiHeadAttention):
    def attention_weights(self, x, mask=None):
        return _explicit(*self.split_qkv(x), mask, scale=1.0)[1]  # (b, h, n, n), the scores unscaled


class MHAWeightsSoftmaxOverQueries(ref.MultiHeadAttention):
    def attention_weights(self, x, mask=None):
        return _explicit(*self.split_qkv(x), mask, axis=-2)[1]


class MHAWeightsWithoutMask(ref.MultiHeadAttention):
    def attention_weights(self, x):  # no mask argument
        return _explicit(*self.split_qkv(x))[1]


class MHAAttentionDropoutInEval(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        out = F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask, dropout_p=self.attn_drop.p)
        return self.proj_drop(self.proj(ref.merge_heads(out)))


class MHAAttentionDropoutIgnored(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        out = F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask)  # no dropout_p
        return self.proj_drop(self.proj(ref.merge_heads(out)))


class MHAProjDropoutFunctional(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        p = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask, dropout_p=p)  # (b, h, n, d)
        return F.dropout(self.proj(ref.merge_heads(out)), self.proj_drop.p)  # training=True, in eval mode too


class MHAWeightsWithDropout(ref.MultiHeadAttention):
    def attention_weights(self, x, mask=None):
        return self.attn_drop(_explicit(*self.split_qkv(x), mask)[1])


class MHAAttentionDropoutOnOutputs(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        out = self.attn_drop(F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask))  # (b, h, n, d)
        return self.proj_drop(self.proj(ref.merge_heads(out)))


class MHAQkvDetached(ref.MultiHeadAttention):
    def split_qkv(self, x):
        qkv = self.qkv(x).detach()  # the graph is cut: no gradient reaches qkv or x
        return rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads).unbind(0)

    def forward(self, x, mask=None):
        out = F.scaled_dot_product_attention(*self.split_qkv(x), attn_mask=mask)  # (b, h, n, d)
        return self.proj(ref.merge_heads(out))


class MHAInPlace(ref.MultiHeadAttention):
    def forward(self, x, mask=None):
        x *= 1.0 + 1e-3  # changes the caller's tensor
        return super().forward(x, mask)


SLIPS = [Slip("split_heads", name, rule, hint, impl) for name, rule, hint, impl in [
    ("view", "output", NO_TRANSPOSE, split_heads_view_no_transpose),
    ("interleaved", "output", INTERLEAVED, split_heads_interleaved),
    ("no_move", "output", HEAD_AXIS, split_heads_not_moved),
    ("heads_as_width", "output", HEADS_AS_WIDTH, split_heads_heads_as_width),
    ("detach", "gradient", CUT_AT, split_heads_detached),
    ("in_place", "inputs", IN_PLACE, split_heads_in_place)]]
SLIPS += [Slip("split_is_correct", name, rule, hint, impl) for name, rule, hint, impl in [
    ("heads_axis_permuted", "correct", REJECTS_CORRECT, test_heads_axis_permuted),
    ("contiguous_required", "correct", LAYOUT, test_contiguous_required),
    ("no_return", "correct", RETURN_BOOL, test_no_return),
    ("shape_only", "tokens", VIEW_PASSED, test_shape_only),
    ("head_changes_only", "tokens", FEATURES_FIRST_PASSED, test_head_changes_only),
    ("permutation_only", "heads", WRONG_HEADS_PASSED, test_permutation_only),
    ("no_shape_check", "sizes", SHAPE_FIRST, test_no_shape_check),
    ("square_heads", "sizes", SQUARE_PASSED, test_square_heads),
    ("one_image", "sizes", BATCH_PASSED, test_one_image)]]
SLIPS += [Slip("MultiHeadAttention", name, rule, hint, impl) for name, rule, hint, impl in [
    ("qkv_bias_ignored", "names", BIAS_IGNORED, MHAQkvBiasIgnored),
    ("qkv_without_bias", "names", QKV_BIAS, MHAQkvWithoutBias),
    ("proj_bias_follows_qkv_bias", "names", PROJ_BIAS, MHAProjBiasFollowsQkvBias),
    ("separate", "names", FUSED_QKV, MHASeparateLayers),
    ("no_head_dim", "attributes", HEAD_DIM, MHANoHeadDim),
    ("order", "split_qkv", ORDER, MHASplitOrder),
    ("no_split_qkv", "split_qkv", NO_SPLIT, MHANoSplitQkv),
    ("view", "output", QKV_VIEW, MHAViewNoTranspose),
    ("merge", "output", MERGED_VIEW, MHAMergeNoTranspose),
    ("scale", "output", BY_DIM_HEAD, MHAScaledByDim),
    ("no_scale", "output", NO_SCALE, MHANoScale),
    ("axis", "output", SOFTMAX_AXIS, MHASoftmaxOverQueries),
    ("no_proj", "output", NO_PROJ, MHANoProj),
    ("order_h_three_d", "output", ORDER, MHAForwardOrderHThreeD),
    ("order_h_d_three", "output", ORDER, MHAForwardOrderHDThree),
    ("interleaved", "output", QKV_INTERLEAVED, MHAInterleaved),
    ("values_from_q", "output", VALUES_FROM, MHAValuesFromQ),
    ("values_from_k", "output", VALUES_FROM, MHAValuesFromK),
    ("no_mask", "mask", MASK_IGNORED, MHAMaskIgnored),
    ("inverted", "mask", MASK_INVERTED, MHAMaskInverted),
    ("weights_mean", "attention_weights", PER_HEAD, MHAWeightsMeanOverHeads),
    ("weights_by_dim", "attention_weights", WEIGHTS_BY_DIM, MHAWeightsScaledByDim),
    ("weights_no_scale", "attention_weights", WEIGHTS_NO_SCALE, MHAWeightsNoScale),
    ("weights_axis", "attention_weights", WEIGHTS_AXIS, MHAWeightsSoftmaxOverQueries),
    ("no_mask_argument", "attention_weights", WEIGHTS_REQUIRED, MHAWeightsWithoutMask),
    ("eval_dropout", "dropout", ATTN_EVAL, MHAAttentionDropoutInEval),
    ("no_dropout", "dropout", ATTN_TRAIN, MHAAttentionDropoutIgnored),
    ("F.dropout", "dropout", PROJ_EVAL, MHAProjDropoutFunctional),
    ("weights_dropout", "dropout", WEIGHTS_DROPOUT, MHAWeightsWithDropout),
    ("output_dropout", "dropout", WHERE["attn_drop"][1], MHAAttentionDropoutOnOutputs),
    ("qkv_detached", "gradient", CUT_AT, MHAQkvDetached),
    ("in_place", "inputs", IN_PLACE, MHAInPlace)]]


# ---- the accepted variants
class MHAStacked(ref.MultiHeadAttention):
    def split_qkv(self, x):  # the einops pattern's (3, b, h, n, d), before unbind: it unpacks as q, k, v
        return rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)


class MHATimm(nn.Module):
    """timm's reshape/permute style, einsum attention and the explicit path's attention dropout."""

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop, self.proj, self.proj_drop = nn.Dropout(attn_drop), nn.Linear(dim, dim), nn.Dropout(proj_drop)

    def split_qkv(self, x):
        b, n, _ = x.shape
        return self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)

    def _weights(self, q, k, mask):
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.head_dim ** -0.5  # (b, h, n, n)
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) if mask is not None else scores.softmax(-1)

    def forward(self, x, mask=None):
        b, n, dim = x.shape
        q, k, v = self.split_qkv(x)
        out = self.attn_drop(self._weights(q, k, mask)) @ v  # (b, h, n, d)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, dim)))

    def attention_weights(self, x, mask=None):
        q, k, _ = self.split_qkv(x)
        return self._weights(q, k, mask)


VARIANTS = [Variant("split_heads", name, impl) for name, impl in [
    ("reference", ref.split_heads), ("view_permute", split_heads_view_permute), ("unflatten", split_heads_unflatten),
    ("stack", split_heads_stack)]] + [
    Variant("split_is_correct", name, impl) for name, impl in [
        ("reference", ref.split_is_correct), ("by_values", test_by_values), ("float_allclose", test_float_allclose)]
] + [Variant("MultiHeadAttention", name, impl) for name, impl in [
    ("reference", ref.MultiHeadAttention), ("timm", MHATimm), ("stacked", MHAStacked)]]
