"""Chapter 02's exercises: split_heads, merge_heads and MultiHeadAttention (heads, dropout in and out of
training, bad input): checks and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
from einops import rearrange
from torch import nn

from .. import attention as ref
from .ch01_self_attention import INTERLEAVED, INVERTED, NO_SCALE, NO_TRANSPOSE, WRONG_AXIS, attention, random_mask
from .core import check
from .gradients import gradient_flow
from .modules import check_attention_weights, check_dropout
from .wiring import dropout_wiring

SPLIT_CASES = ((2, 5, 12, 3), (1, 1, 6, 2), (3, 7, 15, 5), (2, 4, 8, 1), (2, 3, 8, 8))
MERGED_NO_TRANSPOSE = ("your heads look merged without a transpose: `.reshape(b, n, h * d)` on the (b, h, n, d) "
                       "tensor mixes tokens and heads; first bring the tokens in front of the heads, "
                       "x.transpose(1, 2) gives (b, n, h, d), then flatten the last two axes")
MERGED_INTERLEAVED = ("your heads' features are interleaved (every h-th feature belongs to one head): put each "
                      "head's d features side by side as one block, the pattern 'b h n d -> b n (h d)'")


@check("split_heads")
def split_heads(c, fn):
    """(b, n, h*d) -> (b, h, n, d): head i owns the i-th contiguous block of d features; gradients reach x; a
    ValueError naming both numbers when the width is not divisible by the heads."""
    g = torch.Generator().manual_seed(3)
    for b, n, width, h in SPLIT_CASES:
        x = torch.randn(b, n, width, generator=g)
        d = width // h
        got = c.call(fn, x, h)
        shape_hints = [((b, n, h, d), "this is (b, n, h, d): move the head axis in front of the tokens "
                                      "(transpose(1, 2)), the result is (b, h, n, d)")]
        if d != h:
            shape_hints.append(((b, d, n, h), "num_heads was used as the width of a head: the pattern's h is "
                                              "num_heads, and einops works out d = width // num_heads"))
        c.close(got, ref.split_heads(x, h), f"split into {h} heads", [
            (NO_TRANSPOSE, lambda x=x, h=h, d=d: x.reshape(b, h, n, d)),
            (INTERLEAVED, lambda x=x, h=h: rearrange(x, "b n (d h) -> b h n d", h=h))], shape_hints=shape_hints)
    gradient_flow(c, fn, lambda t: c.call(fn, t["x"], 3), lambda t: ref.split_heads(t["x"], 3),
                  dict(x=torch.randn(2, 4, 12, generator=g)))
    c.raises(fn, torch.randn(2, 3, 10, generator=g), 4, why="a width of 10 is not divisible by 4 heads",
             names=(10, 4), hint="check `x.shape[-1] % num_heads` first and raise a ValueError naming both numbers",
             rule="error")


@check("merge_heads")
def merge_heads(c, fn):
    """(b, h, n, d) -> (b, n, h*d), the inverse of split_heads; gradients reach x."""
    g = torch.Generator().manual_seed(4)
    for b, n, width, h in SPLIT_CASES:
        d = width // h
        x = torch.randn(b, h, n, d, generator=g)
        got = c.call(fn, x)
        c.close(got, ref.merge_heads(x), "merged heads", [
            (MERGED_NO_TRANSPOSE, lambda x=x: x.reshape(b, n, width)),
            (MERGED_INTERLEAVED, lambda x=x: rearrange(x, "b h n d -> b n (d h)"))],
            shape_hints=[((b, n, h, d), "this is still (b, n, h, d): flatten heads and features into h*d"),
                         ((b, h, n * d), "this flattens tokens and features together: transpose heads and tokens "
                                         "first, (b, h, n, d) -> (b, n, h, d), then flatten the last two")])
        c.close(ref.split_heads(got, h), x, "split_heads(merge_heads(x)), which should give x back")
    gradient_flow(c, fn, lambda t: c.call(fn, t["x"]), lambda t: ref.merge_heads(t["x"]),
                  dict(x=torch.randn(2, 3, 4, 5, generator=g)))


ORDER = ("the qkv output is split in the wrong order: it is laid out [q | k | v], each then split into heads, "
         "the pattern 'b n (three h d)'")
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


def reference_attention(m, x, mask=None):
    """The reference module's (out before proj (b, h, n, d), weights (b, h, n, n)), computed explicitly."""
    q, k, v = rearrange(m.qkv(x), "b n (three h d) -> three b h n d", three=3, h=m.num_heads).unbind(0)
    return ref.scaled_dot_product_attention(q, k, v, mask)


def _variant(m, x, mask=None, layout="three h d", merge="h d", proj=True, values="v", **kw):
    """MultiHeadAttention with one mistake (for diagnosis only)."""
    q, k, v = rearrange(m.qkv(x), f"b n ({layout}) -> three b h n d", three=3, h=m.num_heads).unbind(0)
    v = {"v": v, "q": q, "k": k}[values]
    out = attention(q, k, v, mask, **kw)[0]  # (b, h, n, d)
    out = rearrange(out, f"b h n d -> b n ({merge})") if merge != "view" else out.reshape(x.shape)
    return m.proj(out) if proj else out


def _hints(m, x, mask=None):
    b, n, dim = x.shape
    h, d = m.num_heads, m.head_dim

    def view_split():
        q, k, v = m.qkv(x).reshape(b, n, 3, dim).permute(2, 0, 1, 3).reshape(3, b, h, n, d).unbind(0)
        return m.proj(ref.merge_heads(attention(q, k, v, mask)[0]))

    return [
        (NO_SCALE.replace("d = q's last size", "d = head_dim"), lambda: _variant(m, x, mask, scale=1.0)),
        ("the scores are scaled by 1/sqrt(dim): use the width of one head, 1/sqrt(head_dim)",
         lambda: _variant(m, x, mask, scale=1 / math.sqrt(dim))),
        (WRONG_AXIS, lambda: _variant(m, x, mask, axis=-2)),
        (NO_TRANSPOSE, view_split),
        ("your heads are merged without a transpose: bring the tokens back in front of the heads "
         "('b h n d -> b n (h d)') before flattening", lambda: _variant(m, x, mask, merge="view")),
        (ORDER, lambda: _variant(m, x, mask, layout="h three d")),
        (ORDER, lambda: _variant(m, x, mask, layout="h d three")),
        (INTERLEAVED, lambda: _variant(m, x, mask, layout="three d h", merge="d h")),
        ("the output projection `proj` seems to be missing after merging the heads",
         lambda: _variant(m, x, mask, proj=False)),
        ("the values are taken from q (or k): attend over v, the third part of qkv's output",
         lambda: _variant(m, x, mask, values="q")),
        ("the values are taken from q (or k): attend over v, the third part of qkv's output",
         lambda: _variant(m, x, mask, values="k")),
    ] + ([(INVERTED, lambda: _variant(m, x, mask, mask_mode="inverted")),
          ("the mask seems to be ignored: pass it on, F.scaled_dot_product_attention(..., attn_mask=mask)",
           lambda: _variant(m, x, mask, mask_mode="none"))] if mask is not None else [])


@check("MultiHeadAttention")
def MultiHeadAttention(c, cls):
    """MultiHeadAttention(dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0): timm's names and
    attributes, split_qkv with the (three h d) layout, forward through the fused kernel, attention_weights
    (b, h, n, n), dropout only while training, gradients reaching x and every layer, ValueErrors for bad sizes."""
    g = torch.Generator().manual_seed(5)
    for dim, heads, batch, n in ((12, 3, 2, 7), (8, 1, 1, 4), (20, 5, 3, 9)):
        reference = ref.MultiHeadAttention(dim, heads).eval()
        model = c.build(cls, dim, heads)
        label = f"MultiHeadAttention({dim}, {heads})"
        c.load(model, reference, [("qkv", "one fused Linear `qkv` (dim -> 3 * dim, with bias) makes q, k and v"),
                                  ("proj", "the output Linear is called `proj` (dim -> dim)")])
        _attributes(c, model, label, dim, heads)
        x = torch.randn(batch, n, dim, generator=g)
        mask = random_mask((n, n), g)
        with torch.no_grad():
            _split_qkv(c, model, reference, x, label)
            c.phase("output")
            c.close(c.call(model, x, label=label), reference(x), "output", _hints(reference, x))
            c.phase("mask")
            c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                    _hints(reference, x, mask))
            c.phase("attention_weights")
            check_attention_weights(c, model, x, reference_attention(reference, x)[1], label, mask,
                                    reference_attention(reference, x, mask)[1],
                                    [((batch, n, n), "one (n, n) map per head: the weights are (b, h, n, n)")],
                                    required="attention_weights(x, mask=None) returning the (b, h, n, n) weights")
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label), lambda t: reference(t["x"]),
                      dict(x=x), model, reference)
    _dropout(c, cls, g)
    _bad_input(c, cls, g)
    c.phase("names")  # qkv_bias=False: a qkv without bias, the same output otherwise
    reference = ref.MultiHeadAttention(12, 3, qkv_bias=False).eval()
    model = c.load(c.build(cls, 12, 3, qkv_bias=False), reference, [
        ("qkv.bias", "qkv_bias=False seems ignored: qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)")])
    x = torch.randn(2, 5, 12, generator=g)
    with torch.no_grad():
        c.close(c.call(model, x, label="MultiHeadAttention(12, 3, qkv_bias=False)"), reference(x),
                "output with qkv_bias=False")


def _attributes(c, model, label, dim, heads):
    """The attributes the statement asks __init__ to store."""
    c.attributes(model, label, [
        ("dim", dim, None), ("num_heads", heads, None),
        ("head_dim", dim // heads, "self.head_dim = dim // num_heads, the width of one head"),
        ("attn_drop", nn.Dropout, "self.attn_drop = nn.Dropout(attn_drop): forward reads its probability"),
        ("proj_drop", nn.Dropout, "self.proj_drop = nn.Dropout(proj_drop), applied after proj")])


def _split_qkv(c, model, reference, x, label):
    """split_qkv(x) -> q, k, v, each (b, h, n, d), the feature axis of qkv's output read as (three h d)."""
    c.phase("split_qkv")
    method = getattr(model, "split_qkv", None)
    if not callable(method):
        c.fail(f"{type(model).__name__} has no method split_qkv", "write split_qkv(x) -> q, k, v as the exercise "
               "asks: forward and attention_weights both start with it")
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
                (INTERLEAVED, lambda: rearrange(qkv, "b n (three d h) -> three b h n d", three=3, h=h)),
                (NO_TRANSPOSE, lambda: qkv.reshape(b, n, 3, dim).permute(2, 0, 1, 3).reshape(3, b, h, n, d))])


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
                     "attention_weights applies the attention dropout: return the weights themselves, without dropout")


def _bad_input(c, cls, g):
    c.raises(cls, 10, 3, why="dim=10 is not divisible by num_heads=3", label="MultiHeadAttention",
             hint="in __init__, check `dim % num_heads` and raise a ValueError", rule="error-dim")
    model = c.build(cls, 12, 3)
    hint = ("at the start of split_qkv, check that x is (b, n, dim): x.ndim == 3 and x.shape[-1] == self.dim, and "
            "raise a ValueError naming x's shape")
    with torch.no_grad():
        for x, why in ((torch.randn(2, 5, 13, generator=g), "tokens of width 13 (not dim=12)"),
                       (torch.randn(5, 12, generator=g), "tokens without a batch axis, (n, dim)")):
            c.raises(model.split_qkv, x, why=why, label="MultiHeadAttention(12, 3).split_qkv", hint=hint,
                     shapes=[tuple(x.shape)], rule="error-shape")
            c.raises(model, x, why=why, label="MultiHeadAttention(12, 3)", hint=hint)


# each exercise's rules: the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule)
# and the words that state it in the exercise's statement
RULES = {
    "split_heads": {
        "output": "head $i$ owning the $i$-th contiguous block of $d$ features",
        "error": "Raise a `ValueError` naming both numbers",
        "gradient": "Gradients flow back to `x`",
    },
    "merge_heads": {
        "output": "`(b, h, n, d)` becomes `(b, n, h*d)`",
        "gradient": "Gradients flow back to `x`",
    },
    "MultiHeadAttention": {
        "attributes": "store `dim`, `num_heads` and `head_dim = dim // num_heads`",
        "names": "create `qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)`",
        "split_qkv": "split the `qkv` output into queries, keys and values of shape `(b, h, n, d)` each",
        "output": "Then merge the heads and apply `proj` and `proj_drop`. Returns `(b, n, dim)`",
        "mask": "attn_mask=mask",
        "attention_weights": "`attention_weights(x, mask=None)`: the weights `(b, h, n, n)`",
        "dropout": "only in training mode",
        "error-dim": "raise a `ValueError` if `dim` is not divisible by `num_heads`",
        "error-shape": "raise a `ValueError` naming the shape otherwise",
        "gradient": "Gradients flow back to `x`, `qkv` and `proj`",
    },
}
