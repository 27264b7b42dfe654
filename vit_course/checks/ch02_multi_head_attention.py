"""Chapter 02's exercises: split_heads, merge_heads and MultiHeadAttention (heads, dropout in and out of
training, bad input): checks and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import attention as ref
from .ch01_self_attention import (
    INTERLEAVED,
    INVERTED,
    NO_SCALE,
    NO_TRANSPOSE,
    WRONG_AXIS,
    _sdpa_einsum,
    attention,
    random_mask,
)
from .core import IN_PLACE, NAME_VALUES, Slip, Variant, check
from .gradients import CUT, CUT_AT, gradient_flow
from .messages import known
from .modules import check_attention_weights, check_dropout, twins
from .wiring import dropout_wiring

HEAD_AXIS = ("this is (b, n, h, d): move the head axis in front of the tokens (transpose(1, 2)), the result is (b, h, "
             "n, d)")
HEADS_AS_WIDTH = ("num_heads was used as the width of a head: the pattern's h is num_heads, and einops works out d = "
                  "width // num_heads")
SPLIT_ERROR = "check `x.shape[-1] % num_heads` first and raise a ValueError naming both numbers"
STILL_SPLIT = "this is still (b, n, h, d): flatten heads and features into h*d"
TOKENS_FEATURES = ("this flattens tokens and features together: transpose heads and tokens first, (b, h, n, d) -> (b, "
                   "n, h, d), then flatten the last two")
BY_DIM_HEAD = "the scores are scaled by 1/sqrt(dim): use the width of one head, 1/sqrt(head_dim)"
MERGED_VIEW = ("your heads are merged without a transpose: bring the tokens back in front of the heads ('b h n d -> b "
               "n (h d)') before flattening")
NO_PROJ = "the output projection `proj` seems to be missing after merging the heads"
VALUES_FROM = "the values are taken from q (or k): attend over v, the third part of qkv's output"
MASK_IGNORED = "the mask seems to be ignored: pass it on, F.scaled_dot_product_attention(..., attn_mask=mask)"
FUSED_QKV = "one fused Linear `qkv` (dim -> 3 * dim, with bias) makes q, k and v"
PER_HEAD = "one (n, n) map per head: the weights are (b, h, n, n)"
WEIGHTS_REQUIRED = "attention_weights(x, mask=None) returning the (b, h, n, n) weights"
BIAS_IGNORED = "qkv_bias=False seems ignored: qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)"
HEAD_DIM = "self.head_dim = dim // num_heads, the width of one head"
NO_SPLIT = "write split_qkv(x) -> q, k, v as the exercise asks: forward and attention_weights both start with it"
WEIGHTS_DROPOUT = "attention_weights applies the attention dropout: return the weights themselves, without dropout"
INIT_CHECK = "in __init__, check `dim % num_heads` and raise a ValueError"
X_CHECK = ("at the start of split_qkv, check that x is (b, n, dim): x.ndim == 3 and x.shape[-1] == self.dim, and "
           "raise a ValueError naming x's shape")
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
        c.close(c.call(fn, x, h), ref.split_heads(x, h), f"split into {h} heads", c.named(c.slips("output"), x, h),
                shape_hints=[((b, n, h, d), HEAD_AXIS), ((b, d, n, h), HEADS_AS_WIDTH)])
    gradient_flow(c, fn, lambda t: c.call(fn, t["x"], 3), lambda t: ref.split_heads(t["x"], 3),
                  dict(x=torch.randn(2, 4, 12, generator=g)))
    c.raises(fn, torch.randn(2, 3, 10, generator=g), 4, why="a width of 10 is not divisible by 4 heads",
             names=(10, 4), hint=SPLIT_ERROR, rule="error")


@check("merge_heads")
def merge_heads(c, fn):
    """(b, h, n, d) -> (b, n, h*d), the inverse of split_heads; gradients reach x."""
    g = torch.Generator().manual_seed(4)
    for b, n, width, h in SPLIT_CASES:
        d = width // h
        x = torch.randn(b, h, n, d, generator=g)
        got = c.call(fn, x)
        c.close(got, ref.merge_heads(x), "merged heads", c.named(c.slips("output"), x),
                shape_hints=[((b, n, h, d), STILL_SPLIT), ((b, h, n * d), TOKENS_FEATURES)])
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
        c.load(model, reference, [("qkv", FUSED_QKV),
                                  ("proj", "the output Linear is called `proj` (dim -> dim)")])
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
            c.phase("attention_weights")
            check_attention_weights(c, model, x, reference_attention(reference, x)[1], label, mask,
                                    reference_attention(reference, x, mask)[1], [((batch, n, n), PER_HEAD)],
                                    required=WEIGHTS_REQUIRED)
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label), lambda t: reference(t["x"]),
                      dict(x=x), model, reference)
    _dropout(c, cls, g)
    _bad_input(c, cls, g)
    c.phase("names")  # qkv_bias=False: a qkv without bias, the same output otherwise
    reference = ref.MultiHeadAttention(12, 3, qkv_bias=False).eval()
    model = c.load(c.build(cls, 12, 3, qkv_bias=False), reference, [("qkv.bias", BIAS_IGNORED)])
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
                     WEIGHTS_DROPOUT)


def _bad_input(c, cls, g):
    c.raises(cls, 10, 3, why="dim=10 is not divisible by num_heads=3", label="MultiHeadAttention",
             hint=INIT_CHECK, rule="error-dim")
    model = c.build(cls, 12, 3)
    with torch.no_grad():
        for x, why in ((torch.randn(2, 5, 13, generator=g), "tokens of width 13 (not dim=12)"),
                       (torch.randn(5, 12, generator=g), "tokens without a batch axis, (n, dim)")):
            c.raises(model.split_qkv, x, why=why, label="MultiHeadAttention(12, 3).split_qkv", hint=X_CHECK,
                     shapes=[tuple(x.shape)], rule="error-shape")
            c.raises(model, x, why=why, label="MultiHeadAttention(12, 3)", hint=X_CHECK)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "split_heads": ("output", "error", "gradient"),
    "merge_heads": ("output", "gradient"),
    "MultiHeadAttention": ("attributes", "names", "split_qkv", "output", "mask", "attention_weights", "dropout",
        "error-dim", "error-shape", "gradient"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
def _split(slip=None):
    """split_heads with one slip (None: the statement's, with unflatten)."""
    def split_heads(x, num_heads):
        b, n, width = x.shape
        if width % num_heads and slip != "no_check":
            raise ValueError("bad width" if slip == "vague" else f"width {width} is not divisible by {num_heads}")
        pattern = {"interleaved": "b n (d h) -> b h n d", "no_move": "b n (h d) -> b n h d"}.get(
            slip, "b n (h d) -> b h n d")
        if slip == "view":
            return x.view(b, num_heads, n, -1)
        if slip == "heads_as_width":
            return rearrange(x, pattern, d=num_heads)
        if slip == "no_check":
            return x[..., : width // num_heads * num_heads].reshape(b, n, num_heads, -1).transpose(1, 2)
        return rearrange(x.detach() if slip == "detach" else x, pattern, h=num_heads)
    return split_heads


def _split_in_place(x, h):
    return x.unsqueeze_(0)[0].unflatten(-1, (h, -1)).transpose(1, 2)


def _merge_in_place(x):
    return x.transpose_(1, 2).flatten(2)


class _MHA(nn.Module):
    """MultiHeadAttention through the fused kernel, as the statement asks, with one slip, ``slip`` (None: none)."""

    slip, knobs = None, {}

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        if dim % num_heads and self.slip != "no_init_check":
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        if self.slip == "no_head_dim":
            del self.head_dim
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias or self.slip == "qkv_bias_ignored")
        self.proj = nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(proj_drop)

    def split_qkv(self, x):
        if self.slip != "no_x_check" and (x.ndim != 3 or x.shape[-1] != self.dim):
            raise ValueError("bad tokens" if self.slip == "vague" else f"expected (b, n, {self.dim}), got "
                             f"{tuple(x.shape)}")
        qkv = self.qkv(x).detach() if self.slip == "qkv_detached" else self.qkv(x)
        layout = "h three d" if self.slip == "order" else "three h d"
        return rearrange(qkv, f"b n ({layout}) -> three b h n d", three=3, h=self.num_heads).unbind(0)

    def forward(self, x, mask=None):
        if self.slip == "in_place":
            x *= 1.0 + 1e-3
        q, k, v = self.split_qkv(x)
        mask = None if self.slip == "no_mask" else mask
        if self.slip == "output_dropout":  # attention dropout on the heads' outputs, not on the weights
            out = self.attn_drop(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            return self.proj_drop(self.proj(ref.merge_heads(out)))
        if self.slip in ("view", "merge", "scale") or self.knobs:  # the explicit path, with the ``attention`` knobs
            b, n, dim = x.shape
            knobs = {"scale": 1 / math.sqrt(dim) if self.slip == "scale" else None} | self.knobs
            layout, merge, values = (knobs.pop(key, default) for key, default in (
                ("layout", "three h d"), ("merge", "h d"), ("values", "v")))
            q, k, v = rearrange(self.qkv(x), f"b n ({layout}) -> three b h n d", three=3, h=self.num_heads).unbind(0)
            if self.slip == "view":
                q, k, v = (t.reshape(b, self.num_heads, n, -1) for t in self.qkv(x).chunk(3, -1))
            out = attention(q, k, {"v": v, "q": q, "k": k}[values], mask, **knobs)[0]
            out = out.reshape(b, n, dim) if self.slip == "merge" else rearrange(out, f"b h n d -> b n ({merge})")
            return self.proj(out)
        p = {"eval_dropout": self.attn_drop.p, "no_dropout": 0.0}.get(
            self.slip, self.attn_drop.p if self.training else 0.0)
        out = ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p))
        out = out if self.slip == "no_proj" else self.proj(out)
        return F.dropout(out, self.proj_drop.p) if self.slip == "F.dropout" else self.proj_drop(out)

    def attention_weights(self, x, mask=None):
        weights = attention(*self.split_qkv(x), mask)[1]
        if self.slip == "weights_dropout":
            weights = self.attn_drop(weights)
        return weights.mean(1) if self.slip == "weights_mean" else weights


def _mha(slip=None, **knobs):
    return type("MultiHeadAttention", (_MHA,), {"slip": slip, "knobs": knobs})


class _MHASeparate(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))


class _MHANoSplit(_MHA):
    split_qkv = None

    def forward(self, x, mask=None):
        return ref.MultiHeadAttention.forward(self, x, mask)

    def attention_weights(self, x, mask=None):
        return ref.MultiHeadAttention.attention_weights(self, x, mask)


class _MHANoMaskArgument(_MHA):
    def attention_weights(self, x):
        return attention(*self.split_qkv(x))[1]


SLIPS = [Slip("split_heads", name, rule, hint, _split(name)) for name, rule, hint in [
    ("view", "output", NO_TRANSPOSE), ("interleaved", "output", INTERLEAVED), ("no_move", "output", HEAD_AXIS),
    ("heads_as_width", "output", HEADS_AS_WIDTH), ("no_check", "error", SPLIT_ERROR), ("vague", "error", NAME_VALUES),
    ("detach", "gradient", CUT_AT)]] + [
    Slip("split_heads", "einops_error", "error", SPLIT_ERROR, lambda x, h: rearrange(x, "b n (h d) -> b h n d", h=h)),
    Slip("split_heads", "in_place", "inputs", IN_PLACE, _split_in_place),
    Slip("merge_heads", "no_transpose", "output", MERGED_NO_TRANSPOSE, lambda x: x.reshape(x.shape[0], x.shape[2], -1)),
    Slip("merge_heads", "interleaved", "output", MERGED_INTERLEAVED, lambda x: rearrange(x, "b h n d -> b n (d h)")),
    Slip("merge_heads", "not_flattened", "output", STILL_SPLIT, lambda x: x.transpose(1, 2)),
    Slip("merge_heads", "tokens_features", "output", TOKENS_FEATURES, lambda x: x.flatten(2)),
    Slip("merge_heads", "view", "output", known("view size is not compatible with input tensor's size and stride"),
         lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1)),
    Slip("merge_heads", "detach", "gradient", CUT, lambda x: ref.merge_heads(x).detach()),
    Slip("merge_heads", "in_place", "inputs", IN_PLACE, _merge_in_place),
]
SLIPS += [Slip("MultiHeadAttention", name, rule, hint, _mha(name)) for name, rule, hint in [
    ("qkv_bias_ignored", "names", BIAS_IGNORED), ("no_head_dim", "attributes", HEAD_DIM),
    ("order", "split_qkv", ORDER), ("view", "output", NO_TRANSPOSE), ("merge", "output", MERGED_VIEW),
    ("scale", "output", BY_DIM_HEAD), ("no_proj", "output", NO_PROJ), ("no_mask", "mask", MASK_IGNORED),
    ("weights_mean", "attention_weights", PER_HEAD), ("eval_dropout", "dropout", ATTN_EVAL),
    ("no_dropout", "dropout", ATTN_TRAIN), ("F.dropout", "dropout", PROJ_EVAL),
    ("weights_dropout", "dropout", WEIGHTS_DROPOUT), ("output_dropout", "dropout", WHERE["attn_drop"][1]),
    ("no_init_check", "error-dim", INIT_CHECK), ("no_x_check", "error-shape", X_CHECK),
    ("vague", "error-shape", NAME_VALUES), ("qkv_detached", "gradient", CUT_AT), ("in_place", "inputs", IN_PLACE)]]
SLIPS += [Slip("MultiHeadAttention", name, rule, hint, _mha(**knobs)) for name, rule, hint, knobs in [
    ("no_scale", "output", NO_SCALE.replace("d = q's last size", "d = head_dim"), dict(scale=1.0)),
    ("axis", "output", WRONG_AXIS, dict(axis=-2)),
    ("order_h_three_d", "output", ORDER, dict(layout="h three d")),
    ("order_h_d_three", "output", ORDER, dict(layout="h d three")),
    ("interleaved", "output", INTERLEAVED, dict(layout="three d h", merge="d h")),
    ("values_from_q", "output", VALUES_FROM, dict(values="q")),
    ("values_from_k", "output", VALUES_FROM, dict(values="k")),
    ("inverted", "mask", INVERTED, dict(mask_mode="inverted"))]]
SLIPS += [Slip("MultiHeadAttention", "separate", "names", FUSED_QKV, _MHASeparate),
          Slip("MultiHeadAttention", "no_split_qkv", "split_qkv", NO_SPLIT, _MHANoSplit),
          Slip("MultiHeadAttention", "no_mask_argument", "attention_weights", WEIGHTS_REQUIRED, _MHANoMaskArgument)]


class _MHAStacked(ref.MultiHeadAttention):
    def split_qkv(self, x):  # the einops pattern's (3, b, h, n, d), before unbind: it unpacks as q, k, v
        super().split_qkv(x)  # validates x
        return rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)


class _MHATimm(_MHA):
    """timm's reshape/permute style with einsum attention and the explicit path's attention dropout."""

    def split_qkv(self, x):
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected (b, n, {self.dim}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        return self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x, mask=None):
        b, n, dim = x.shape
        q, k, v = self.split_qkv(x)
        out = self.attn_drop(_sdpa_einsum(q, k, v, mask)[1]) @ v
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, dim)))

    def attention_weights(self, x, mask=None):
        return _sdpa_einsum(*self.split_qkv(x), mask)[1]


def _split_view(x, h):
    b, n, width = x.shape
    if width % h:
        raise ValueError(f"{width} features cannot be split into {h} heads")
    return x.view(b, n, h, width // h).permute(0, 2, 1, 3)


VARIANTS = [Variant("split_heads", name, impl) for name, impl in [
    ("reference", ref.split_heads), ("view_permute", _split_view), ("einops", _split())]] + [
    Variant("merge_heads", "reference", ref.merge_heads),
    Variant("merge_heads", "flatten", lambda x: x.transpose(1, 2).flatten(2))] + [
    Variant("MultiHeadAttention", name, impl) for name, impl in [
        ("reference", ref.MultiHeadAttention), ("fused", _mha()), ("timm", _MHATimm), ("stacked", _MHAStacked)]]
