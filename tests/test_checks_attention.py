"""The attention checks reject the mistakes learners make (with the right hint) and accept correct variants."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import vit_course as ref
from vit_course import checks
from vit_course.checks import CheckFailed

from .check_helpers import accepts, rejects

# --- scaled_dot_product_attention ---------------------------------------------------------------------------

def sdpa(q, k, v, mask=None, scale=None, axis=-1, fill=float("-inf"), invert=False, after=False):
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and not after:
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    weights = scores.softmax(axis)
    if mask is not None and after:
        weights = weights * mask
    return weights @ v, weights


def sdpa_einsum(q, k, v, mask=None):
    q = q / q.shape[-1] ** 0.5  # pre-scaled queries
    scores = torch.einsum("...id,...jd->...ij", q, k)
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...ij,...jd->...id", weights, v), weights


def sdpa_torch_out(q, k, v, mask=None):
    weights = sdpa(q, k, v, mask, fill=-1e9)[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights


@pytest.mark.parametrize("impl", [ref.scaled_dot_product_attention, sdpa, sdpa_einsum, sdpa_torch_out])
def test_sdpa_accepts_correct_variants(impl, capsys):
    accepts(checks.scaled_dot_product_attention, impl, capsys)


def _inplace(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])
    return sdpa(q, k, v, mask, scale=1.0)


def _not_done(q, k, v, mask=None):
    raise NotImplementedError("scaled_dot_product_attention")


@pytest.mark.parametrize("impl, hint", [
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=1.0), "without the 1/sqrt"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=1 / q.shape[-1]), "divided by d instead"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, axis=-2), "wrong axis"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, invert=True), "inverted"),
    (lambda q, k, v, mask=None: sdpa(q, k, v), "ignored"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, fill=0.0), "instead of -inf"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, after=True), "after the softmax"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask)[::-1], r"returned \(weights, out\)"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask)[0], "pair"),
    (lambda q, k, v: sdpa(q, k, v), "raised TypeError"),
    (lambda q, k, v, mask=None: (sdpa(q, k, v, mask)[0].double(), sdpa(q, k, v, mask)[1]), "dtype"),
    (lambda q, k, v, mask=None: (sdpa(q, k, v, mask)[0] * float("nan"), sdpa(q, k, v, mask)[1]), "NaN"),
    (lambda q, k, v, mask=None: sdpa(k, q, v, mask), "swapped|raised"),
    (_inplace, "changed its input `q` in place"),
    (_not_done, "not done yet: scaled_dot_product_attention"),
    (None, "expected your scaled_dot_product_attention"),
])
def test_sdpa_rejects_mistakes(impl, hint):
    rejects(checks.scaled_dot_product_attention, impl, hint)


def test_failure_says_what_was_tried():
    with pytest.raises(CheckFailed) as info:
        checks.scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=1.0))
    message = str(info.value)
    assert message.startswith("scaled_dot_product_attention: wrong")
    assert "tried: scaled_dot_product_attention(tensor(5, 6), tensor(7, 6), tensor(7, 3))" in message
    assert "expected" in message and "likely cause" in message


def test_learner_error_names_the_line():
    def broken(q, k, v, mask=None):
        scores = q @ k  # forgot the transpose
        return scores, scores

    with pytest.raises(CheckFailed, match=r"raised RuntimeError.*\n  at line \d+: scores = q @ k"):
        checks.scaled_dot_product_attention(broken)


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


# --- SelfAttention --------------------------------------------------------------------------------------------

class SelfAttentionSDPA(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, head_dim, bias=False) for _ in range(3))

    def forward(self, x, mask=None, return_attention=False):
        out, weights = sdpa_einsum(self.q(x), self.k(x), self.v(x), mask)
        return (out, weights) if return_attention else out


class SelfAttentionWrong(SelfAttentionSDPA):
    def __init__(self, dim, head_dim, **kw):
        super().__init__(dim, head_dim)
        self.kw, self.dim = kw, dim

    def forward(self, x, mask=None, return_attention=False):
        kw = dict(self.kw)
        if kw.pop("by_dim", False):
            kw["scale"] = 1 / math.sqrt(self.dim)
        out, weights = sdpa(self.q(x), self.k(x), self.v(x), mask, **kw)
        return (out, weights) if return_attention else out


def test_self_attention_accepts(capsys):
    accepts(checks.SelfAttention, ref.SelfAttention, capsys)
    accepts(checks.SelfAttention, SelfAttentionSDPA, capsys)


class SelfAttentionBias(SelfAttentionSDPA):
    def __init__(self, dim, head_dim):
        super().__init__(dim, head_dim)
        self.q = nn.Linear(dim, head_dim)


@pytest.mark.parametrize("impl, hint", [
    (lambda d, h: SelfAttentionWrong(d, h, scale=1.0), "without the 1/sqrt"),
    (lambda d, h: SelfAttentionWrong(d, h, axis=-2), "wrong axis"),
    (lambda d, h: SelfAttentionWrong(d, h, invert=True), "inverted"),
    (lambda d, h: SelfAttentionWrong(d, h, by_dim=True), r"1/sqrt\(dim\)"),
    (SelfAttentionBias, "no bias"),
    (nn.Linear, "names"),
    (ref.SelfAttention(4, 4), "not an instance"),
])
def test_self_attention_rejects(impl, hint):
    if isinstance(impl, type(lambda: 0)):  # a factory: wrap it into a class with the contract's constructor
        factory = impl
        impl = type("SelfAttention", (nn.Module,), {"__new__": lambda cls, d, h: factory(d, h)})
    rejects(checks.SelfAttention, impl, hint)


# --- split_heads / merge_heads ----------------------------------------------------------------------------------

def split_view(x, h):
    b, n, _ = x.shape
    return x.view(b, h, n, -1)


def split_ok(x, h):
    b, n, width = x.shape
    return x.view(b, n, h, width // h).permute(0, 2, 1, 3)


@pytest.mark.parametrize("impl, hint", [
    (split_view, "without a transpose"),
    (lambda x, h: rearrange(x, "b n (d h) -> b h n d", h=h), "contiguous block"),
    (lambda x, h: rearrange(x, "b n (h d) -> b n h d", h=h), "move the head axis"),
])
def test_split_heads_rejects(impl, hint):
    rejects(checks.split_heads, impl, hint)


@pytest.mark.parametrize("impl", [ref.split_heads, split_ok, lambda x, h: x.unflatten(-1, (h, -1)).transpose(1, 2)])
def test_split_heads_accepts(impl, capsys):
    accepts(checks.split_heads, impl, capsys)


@pytest.mark.parametrize("impl, hint", [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "without a transpose"),
    (lambda x: rearrange(x, "b h n d -> b n (d h)"), "interleaved"),
    (lambda x: x.transpose(1, 2), "flatten heads"),
    (lambda x: x.flatten(2), "flattens tokens and features together"),
])
def test_merge_heads_rejects(impl, hint):
    rejects(checks.merge_heads, impl, hint)


@pytest.mark.parametrize("impl", [ref.merge_heads, lambda x: x.transpose(1, 2).flatten(2)])
def test_merge_heads_accepts(impl, capsys):
    accepts(checks.merge_heads, impl, capsys)


# --- MultiHeadAttention ---------------------------------------------------------------------------------------

class MHATimmStyle(nn.Module):
    """timm's reshape/permute style with einsum attention: a correct alternative."""

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)

    def forward(self, x, mask=None, return_attention=False):
        b, n, dim = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        out, weights = sdpa_einsum(q, k, v, mask)
        out = self.proj(out.transpose(1, 2).reshape(b, n, dim))
        return (out, weights) if return_attention else out


class MHAWrong(MHATimmStyle):
    mistake = None

    def forward(self, x, mask=None, return_attention=False):
        b, n, dim = x.shape
        h = self.num_heads
        qkv = self.qkv(x)
        if self.mistake == "view":
            q, k, v = (t.reshape(b, h, n, dim // h) for t in qkv.chunk(3, -1))
        elif self.mistake == "order":
            q, k, v = rearrange(qkv, "b n (h three d) -> three b h n d", three=3, h=h)
        else:
            q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=h)
        out, weights = sdpa(q, k, v, mask, scale=1 / math.sqrt(dim) if self.mistake == "scale" else None)
        out = out.reshape(b, n, dim) if self.mistake == "merge" else ref.merge_heads(out)
        out = out if self.mistake == "proj" else self.proj(out)
        return (out, weights) if return_attention else out


def mha_with(mistake):
    return type("MultiHeadAttention", (MHAWrong,), {"mistake": mistake})


class MHASeparate(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))


@pytest.mark.parametrize("impl, hint", [
    (mha_with("view"), "reshaped without a transpose"),
    (mha_with("merge"), "merged without a transpose"),
    (mha_with("scale"), r"1/sqrt\(head_dim\)"),
    (mha_with("order"), "wrong order"),
    (mha_with("proj"), "`proj` seems to be missing"),
    (MHASeparate, "one fused Linear `qkv`"),
])
def test_mha_rejects(impl, hint):
    rejects(checks.MultiHeadAttention, impl, hint)


@pytest.mark.parametrize("impl", [ref.MultiHeadAttention, MHATimmStyle, mha_with(None)])
def test_mha_accepts(impl, capsys):
    accepts(checks.MultiHeadAttention, impl, capsys)
