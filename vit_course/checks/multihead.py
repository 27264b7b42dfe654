"""Check for chapter 02's module: MultiHeadAttention (heads, dropout in and out of training, bad input)."""

import math

import torch
from einops import rearrange

from .. import attention as ref
from .common import (
    INTERLEAVED,
    INVERTED,
    NO_SCALE,
    NO_TRANSPOSE,
    WRONG_AXIS,
    accepts,
    attention,
    check_attention_weights,
    check_dropout,
    random_mask,
)
from .core import check

ORDER = ("the qkv output is split in the wrong order: it is laid out [q | k | v], each then split into heads, "
         "the pattern 'b n (three h d)'")
ATTN_EVAL = ("attention dropout is applied in eval mode: pass dropout_p=self.attn_drop.p only while training, "
             "`self.attn_drop.p if self.training else 0.0`")
ATTN_TRAIN = ("attn_drop seems ignored: while training pass dropout_p=self.attn_drop.p to "
              "F.scaled_dot_product_attention")
PROJ_EVAL = ("the output dropout is applied in eval mode: use the module self.proj_drop (an nn.Dropout knows the "
             "mode), not F.dropout(out, p)")
PROJ_TRAIN = "proj_drop seems ignored: apply self.proj_drop after self.proj"


def reference_attention(m, x, mask=None):
    """The reference module's (out before proj (b, h, n, d), weights (b, h, n, n)), computed explicitly."""
    q, k, v = rearrange(m.qkv(x), "b n (three h d) -> three b h n d", three=3, h=m.num_heads).unbind(0)
    return ref.scaled_dot_product_attention(q, k, v, mask)


def _variant(m, x, mask=None, layout="three h d", merge="h d", proj=True, **kw):
    """MultiHeadAttention with one mistake (for diagnosis only)."""
    q, k, v = rearrange(m.qkv(x), f"b n ({layout}) -> three b h n d", three=3, h=m.num_heads).unbind(0)
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
    ] + ([(INVERTED, lambda: _variant(m, x, mask, mask_mode="inverted")),
          ("the mask seems to be ignored: pass it on, F.scaled_dot_product_attention(..., attn_mask=mask)",
           lambda: _variant(m, x, mask, mask_mode="none"))] if mask is not None else [])


@check("MultiHeadAttention")
def MultiHeadAttention(c, cls):
    """MultiHeadAttention(dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0): fused qkv Linear, heads
    split (three h d), output proj, dropout only while training, ValueError for bad sizes; optionally
    attention_weights(x, mask=None) -> (b, h, n, n)."""
    g = torch.Generator().manual_seed(5)
    for dim, heads, batch, n in ((12, 3, 2, 7), (8, 1, 1, 4), (20, 5, 3, 9)):
        reference = ref.MultiHeadAttention(dim, heads).eval()
        model = c.build(cls, dim, heads)
        c.load(model, reference, [("qkv", "one fused Linear `qkv` (dim -> 3 * dim, with bias) makes q, k and v"),
                                  ("proj", "the output Linear is called `proj` (dim -> dim)")])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"MultiHeadAttention({dim}, {heads})"
        mask = random_mask((n, n), g)
        with torch.no_grad():
            c.close(c.call(model, x, label=label), reference(x), "output", _hints(reference, x))
            if accepts(model.forward, "mask"):
                c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                        _hints(reference, x, mask))
            check_attention_weights(c, model, x, reference_attention(reference, x)[1], label, mask,
                                    reference_attention(reference, x, mask)[1],
                                    [((batch, n, n), "one (n, n) map per head: the weights are (b, h, n, n)")])
    _dropout(c, cls, g)
    _bad_input(c, cls, g)


def _dropout(c, cls, g):
    """Built with attn_drop (or proj_drop) = 0.5: the reference's output in eval mode, random while training."""
    dim, heads = 12, 3
    x = torch.randn(2, 6, dim, generator=g)
    for key, eval_hint, train_hint in (("attn_drop", ATTN_EVAL, ATTN_TRAIN), ("proj_drop", PROJ_EVAL, PROJ_TRAIN)):
        reference = ref.MultiHeadAttention(dim, heads, **{key: 0.5}).eval()
        model = c.load(c.build(cls, dim, heads, **{key: 0.5}), reference)
        label = f"MultiHeadAttention({dim}, {heads}, {key}=0.5)"
        with torch.no_grad():
            check_dropout(c, model, x, reference(x), f"with {key}=0.5", eval_hint, train_hint, label)
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
             hint="in __init__, check `dim % num_heads` and raise a ValueError naming both")
    model = c.build(cls, 12, 3)
    hint = "at the start of forward, check that x is (b, n, dim): x.ndim == 3 and x.shape[-1] == self.dim"
    with torch.no_grad():
        c.raises(model, torch.randn(2, 5, 13, generator=g), why="tokens of width 13 (not dim=12)",
                 label="MultiHeadAttention(12, 3)", hint=hint)
        c.raises(model, torch.randn(5, 12, generator=g), why="tokens without a batch axis, (n, dim)",
                 label="MultiHeadAttention(12, 3)", hint=hint)
