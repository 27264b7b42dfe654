"""Checks for chapters 01-02: scaled_dot_product_attention, SelfAttention, split/merge_heads, MultiHeadAttention."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import inspect
import math

import torch
import torch.nn.functional as F
from einops import rearrange

from .. import attention as ref
from .core import check

NO_SCALE = "this is the output without the 1/sqrt(d) scaling: divide the scores q k^T by sqrt(d), d = q's last size"
BY_D = "the scores look divided by d instead of sqrt(d)"
BY_DV = "the scores look scaled by the values' width or the number of keys: the scale is 1/sqrt(d), d = q's last size"
WRONG_AXIS = "softmax over the wrong axis: each query's weights must sum to 1 over the keys, the last axis (dim=-1)"
INVERTED = "the mask looks inverted: True means 'may attend', so fill the scores where the mask is False"
IGNORED = "the mask seems to be ignored: set the scores where the mask is False to -inf before the softmax"
ZEROED = "masked scores were set to 0 instead of -inf: exp(0) = 1 still gives them weight"
AFTER = "the mask was applied after the softmax: mask the scores before it, so the rows still sum to 1"
QK_SWAPPED = "queries and keys look swapped: scores are q k^T, one row per query"


def attention(q, k, v, mask=None, scale=None, axis=-1, mask_mode="ok"):
    """Reference attention with the knobs learners get wrong (for diagnosis only)."""
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and mask_mode == "ok":
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask, float("-inf"))
    elif mask is not None and mask_mode == "zero":
        scores = scores.masked_fill(~mask, 0.0)
    weights = scores.softmax(axis)
    if mask is not None and mask_mode == "after":
        weights = weights * mask
    return weights @ v, weights


def attention_hints(q, k, v, mask=None, which=0):
    """(hint, thunk) pairs: the outputs (which=0) or weights (which=1) of the usual attention mistakes."""
    d = q.shape[-1]
    variants = [(NO_SCALE, dict(scale=1.0)), (BY_D, dict(scale=1 / d)),
                (BY_DV, dict(scale=1 / math.sqrt(v.shape[-1]))), (BY_DV, dict(scale=1 / math.sqrt(k.shape[-2]))),
                (WRONG_AXIS, dict(axis=-2))]
    if mask is not None:
        variants += [(INVERTED, dict(mask_mode="inverted")), (IGNORED, dict(mask_mode="none")),
                     (ZEROED, dict(mask_mode="zero")), (AFTER, dict(mask_mode="after"))]
    hints = [(h, lambda kw=kw: attention(q, k, v, mask, **kw)[which]) for h, kw in variants]
    hints.append((QK_SWAPPED, lambda: attention(k, q, v, None if mask is None else mask.transpose(-2, -1))[which]))
    return hints


def _accepts(fn, name):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _no_fully_masked_rows(mask):
    mask[..., 0] = True  # every query may attend to at least one key
    return mask


SDPA_CASES = [  # (q shape, k shape, v shape, mask shape or None)
    ((5, 6), (7, 6), (7, 3), None),
    ((2, 5, 6), (2, 7, 6), (2, 7, 9), None),
    ((2, 3, 4, 8), (2, 3, 9, 8), (2, 3, 9, 5), None),
    ((1, 1, 6), (1, 4, 6), (1, 4, 2), None),
    ((2, 5, 6), (2, 7, 6), (2, 7, 3), (5, 7)),
    ((2, 3, 6, 4), (2, 3, 6, 4), (2, 3, 6, 7), "causal"),
    ((2, 3, 4, 8), (2, 3, 9, 8), (2, 3, 9, 5), (2, 1, 4, 9)),
]


@check("scaled_dot_product_attention")
def scaled_dot_product_attention(c, fn):
    """softmax(q k^T / sqrt(d)) v on awkward shapes, with and without boolean masks (True = may attend)."""
    g = torch.Generator().manual_seed(1)
    for q_shape, k_shape, v_shape, mask_shape in SDPA_CASES:
        q, k, v = (torch.randn(s, generator=g) * 1.5 for s in (q_shape, k_shape, v_shape))
        mask = None
        if mask_shape == "causal":
            mask = torch.ones(q_shape[-2], k_shape[-2], dtype=torch.bool).tril()
        elif mask_shape is not None:
            mask = _no_fully_masked_rows(torch.rand(mask_shape, generator=g) > 0.4)
        out = c.call(fn, q, k, v) if mask is None else c.call(fn, q, k, v, mask)
        expected_out, expected_weights = ref.scaled_dot_product_attention(q, k, v, mask)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            got = "None" if out is None else f"a {type(out).__name__}"
            c.fail(f"should return a pair (out, weights), got {got}",
                   "return both: `return weights @ v, weights`")
        got_out, got_weights = out
        swapped = (tuple(expected_weights.shape), "you returned (weights, out): the output comes first")
        c.tensor(got_weights, "weights", expected_weights.shape, torch.float32,
                 [(expected_out.shape, "you returned (weights, out): the output comes first")])
        c.close(got_weights, expected_weights, "attention weights", attention_hints(q, k, v, mask, which=1))
        c.close(got_weights.sum(-1), torch.ones(expected_weights.shape[:-1]), "row sums of the weights")
        c.close(got_out, expected_out, "output", attention_hints(q, k, v, mask), shape_hints=[swapped])
        torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        c.close(got_out, torch_out, "output (against torch.nn.functional.scaled_dot_product_attention)")


@check("SelfAttention")
def SelfAttention(c, cls):
    """SelfAttention(dim, head_dim): bias-free Linear layers q, k, v; forward(x, mask=None, return_attention=False)."""
    g = torch.Generator().manual_seed(2)
    for dim, head_dim, batch, n in ((10, 6, 2, 7), (4, 9, 3, 1), (16, 8, 1, 5)):
        reference = ref.SelfAttention(dim, head_dim).eval()
        model = c.build(cls, dim, head_dim)
        c.load(model, reference, [("bias", "the q, k and v layers have no bias: nn.Linear(dim, head_dim, bias=False)"),
                                  ("", "name the three layers q, k and v")])
        x = torch.randn(batch, n, dim, generator=g)
        q, k, v = reference.q(x).detach(), reference.k(x).detach(), reference.v(x).detach()
        with torch.no_grad():
            expected, weights = reference(x, return_attention=True)
            got = c.call(model, x, label=f"SelfAttention({dim}, {head_dim})")
            c.close(got, expected, "output", attention_hints(q, k, v) + [
                ("the scores are scaled by 1/sqrt(dim): use the width of the queries, 1/sqrt(head_dim)",
                 lambda: attention(q, k, v, scale=1 / math.sqrt(dim))[0]),
                ("this is attention on x itself: project x with self.q, self.k and self.v first",
                 lambda: attention(x, x, x)[0])])
            mask = _no_fully_masked_rows(torch.rand(n, n, generator=g) > 0.5)
            got = c.call(model, x, mask=mask, label=f"SelfAttention({dim}, {head_dim})")
            c.close(got, reference(x, mask=mask), "output with a mask", attention_hints(q, k, v, mask))
            if _accepts(model.forward, "return_attention"):
                pair = c.call(model, x, return_attention=True, label=f"SelfAttention({dim}, {head_dim})")
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    c.fail("with return_attention=True, forward should return (out, weights)")
                c.close(pair[0], expected, "output with return_attention=True")
                c.close(pair[1], weights, "weights with return_attention=True", attention_hints(q, k, v, which=1))


SPLIT_CASES = ((2, 5, 12, 3), (1, 1, 6, 2), (3, 7, 15, 5), (2, 4, 8, 1), (2, 3, 8, 8))
NO_TRANSPOSE = ("your heads look reshaped without a transpose: `.view(b, h, n, d)` mixes tokens and heads; "
                "reshape to (b, n, h, d) first, then transpose tokens and heads")
INTERLEAVED = ("your heads take every h-th feature: head i should own the i-th contiguous block of d features, "
               "the pattern 'b n (h d) -> b h n d'")


@check("split_heads")
def split_heads(c, fn):
    """(b, n, h*d) -> (b, h, n, d): head i owns the i-th contiguous block of d features."""
    g = torch.Generator().manual_seed(3)
    for b, n, width, h in SPLIT_CASES:
        x = torch.randn(b, n, width, generator=g)
        d = width // h
        got = c.call(fn, x, h)
        c.close(got, ref.split_heads(x, h), f"split into {h} heads", [
            (NO_TRANSPOSE, lambda x=x, h=h, d=d: x.reshape(b, h, n, d)),
            (INTERLEAVED, lambda x=x, h=h: rearrange(x, "b n (d h) -> b h n d", h=h))],
            shape_hints=[((b, n, h, d), "this is (b, n, h, d): move the head axis in front of the tokens "
                                        "(transpose(1, 2)), the result is (b, h, n, d)")])


@check("merge_heads")
def merge_heads(c, fn):
    """(b, h, n, d) -> (b, n, h*d), the inverse of split_heads."""
    g = torch.Generator().manual_seed(4)
    for b, n, width, h in SPLIT_CASES:
        d = width // h
        x = torch.randn(b, h, n, d, generator=g)
        got = c.call(fn, x)
        c.close(got, ref.merge_heads(x), "merged heads", [
            (NO_TRANSPOSE.replace("`.view(b, h, n, d)`", "`.reshape(b, n, h * d)`").replace(
                "reshape to (b, n, h, d) first, then transpose", "transpose heads and tokens first, then reshape"),
             lambda x=x: x.reshape(b, n, width)),
            (INTERLEAVED.replace("take every", "are interleaved: each head's block should be contiguous, not every"),
             lambda x=x: rearrange(x, "b h n d -> b n (d h)"))],
            shape_hints=[((b, n, h, d), "this is still (b, n, h, d): flatten heads and features into h*d"),
                         ((b, h, n * d), "this flattens tokens and features together: transpose heads and tokens "
                                         "first, (b, h, n, d) -> (b, n, h, d), then flatten the last two")])
        c.close(ref.split_heads(got, h), x, "split_heads(merge_heads(x)), which should give x back")


def _mha_variant(m, x, mask=None, layout="three h d", merge="h d", proj=True, **kw):
    """MultiHeadAttention with one mistake (for diagnosis only)."""
    q, k, v = rearrange(m.qkv(x), f"b n ({layout}) -> three b h n d", three=3, h=m.num_heads).unbind(0)
    out = attention(q, k, v, mask, **kw)[0]  # (b, h, n, d)
    out = rearrange(out, f"b h n d -> b n ({merge})") if merge != "view" else out.reshape(x.shape)
    return m.proj(out) if proj else out


def _mha_hints(m, x, mask=None):
    b, n, dim = x.shape
    h, d = m.num_heads, m.head_dim

    def view_split():
        q, k, v = m.qkv(x).reshape(b, n, 3, dim).permute(2, 0, 1, 3).reshape(3, b, h, n, d).unbind(0)
        return m.proj(ref.merge_heads(attention(q, k, v, mask)[0]))

    return [
        (NO_SCALE.replace("d = q's last size", "d = head_dim"), lambda: _mha_variant(m, x, mask, scale=1.0)),
        ("the scores are scaled by 1/sqrt(dim): use the width of one head, 1/sqrt(head_dim)",
         lambda: _mha_variant(m, x, mask, scale=1 / math.sqrt(dim))),
        (WRONG_AXIS, lambda: _mha_variant(m, x, mask, axis=-2)),
        (NO_TRANSPOSE, view_split),
        ("your heads are merged without a transpose: bring the tokens back in front of the heads "
         "('b h n d -> b n (h d)') before flattening", lambda: _mha_variant(m, x, mask, merge="view")),
        ("the qkv output is split in the wrong order: it is laid out [q | k | v], each then split into heads, "
         "the pattern 'b n (three h d)'", lambda: _mha_variant(m, x, mask, layout="h three d")),
        ("the qkv output is split in the wrong order: it is laid out [q | k | v], each then split into heads, "
         "the pattern 'b n (three h d)'", lambda: _mha_variant(m, x, mask, layout="h d three")),
        (INTERLEAVED, lambda: _mha_variant(m, x, mask, layout="three d h", merge="d h")),
        ("the output projection `proj` seems to be missing after merging the heads",
         lambda: _mha_variant(m, x, mask, proj=False)),
    ] + ([(INVERTED, lambda: _mha_variant(m, x, mask, mask_mode="inverted")),
          (IGNORED, lambda: _mha_variant(m, x, mask, mask_mode="none"))] if mask is not None else [])


@check("MultiHeadAttention")
def MultiHeadAttention(c, cls):
    """MultiHeadAttention(dim, num_heads): fused qkv Linear, heads split (three h d), output proj."""
    g = torch.Generator().manual_seed(5)
    for dim, heads, batch, n in ((12, 3, 2, 7), (8, 1, 1, 4), (20, 5, 3, 9)):
        reference = ref.MultiHeadAttention(dim, heads).eval()
        model = c.build(cls, dim, heads)
        c.load(model, reference, [("qkv", "one fused Linear `qkv` (dim -> 3 * dim, with bias) makes q, k and v"),
                                  ("proj", "the output Linear is called `proj` (dim -> dim)")])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"MultiHeadAttention({dim}, {heads})"
        with torch.no_grad():
            expected, weights = reference(x, return_attention=True)
            c.close(c.call(model, x, label=label), expected, "output", _mha_hints(reference, x))
            if _accepts(model.forward, "mask"):
                mask = _no_fully_masked_rows(torch.rand(n, n, generator=g) > 0.5)
                c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                        _mha_hints(reference, x, mask))
            if _accepts(model.forward, "return_attention"):
                pair = c.call(model, x, return_attention=True, label=label)
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    c.fail("with return_attention=True, forward should return (out, weights (b, h, n, n))")
                c.close(pair[0], expected, "output with return_attention=True", _mha_hints(reference, x))
                c.close(pair[1], weights, "attention weights (b, h, n, n)")
