"""The attention checks reject the mistakes learners make (with the right hint) and accept correct variants."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import vit_course as ref
from vit_course import checks
from vit_course.checks import CheckFailed

from .check_helpers import accepts, rejects, slip

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


@pytest.mark.parametrize("impl", [ref.scaled_dot_product_attention, sdpa, sdpa_einsum])
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

    with pytest.raises(CheckFailed, match=r"raised RuntimeError.*\n  at line \d+ of your code: scores = q @ k(.|\n)*"
                       r"likely cause: the scores are q times the keys with their last two axes swapped"):
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
    """The API of the course: forward gives the output, attention_weights the (b, n, n) weights."""

    def __init__(self, dim, head_dim):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, head_dim, bias=False) for _ in range(3))

    def forward(self, x, mask=None):
        return sdpa_einsum(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return sdpa_einsum(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionOldAPI(SelfAttentionSDPA):
    """The former API (return_attention=True gives (out, weights)) without attention_weights, which the statement
    asks for: rejected."""

    attention_weights = None

    def forward(self, x, mask=None, return_attention=False):
        out, weights = sdpa(self.q(x), self.k(x), self.v(x), mask)
        return (out, weights) if return_attention else out


class SelfAttentionWrong(SelfAttentionSDPA):
    def __init__(self, dim, head_dim, **kw):
        super().__init__(dim, head_dim)
        self.kw, self.dim = kw, dim

    def forward(self, x, mask=None):
        kw = dict(self.kw)
        if kw.pop("by_dim", False):
            kw["scale"] = 1 / math.sqrt(self.dim)
        return sdpa(self.q(x), self.k(x), self.v(x), mask, **kw)[0]


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
    if width % h:
        raise ValueError(f"{width} features cannot be split into {h} heads")
    return x.view(b, n, h, width // h).permute(0, 2, 1, 3)


def split_unflatten(x, h):
    if x.shape[-1] % h:
        raise ValueError(f"width {x.shape[-1]} is not divisible by num_heads={h}")
    return x.unflatten(-1, (h, -1)).transpose(1, 2)


@pytest.mark.parametrize("impl, hint", [
    (split_view, "without a transpose"),
    (lambda x, h: rearrange(x, "b n (d h) -> b h n d", h=h), "contiguous block"),
    (lambda x, h: rearrange(x, "b n (h d) -> b n h d", h=h), "move the head axis"),
])
def test_split_heads_rejects(impl, hint):
    rejects(checks.split_heads, impl, hint)


@pytest.mark.parametrize("impl", [ref.split_heads, split_ok, split_unflatten])
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
        if dim % num_heads:
            raise ValueError(f"{dim} is not divisible by {num_heads}")
        self.num_heads, self.dim, self.head_dim = num_heads, dim, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(proj_drop)

    def split_qkv(self, x):
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected (b, n, {self.dim}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        return self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x, mask=None):
        b, n, dim = x.shape
        q, k, v = self.split_qkv(x)
        out, weights = sdpa_einsum(q, k, v, mask)
        out = self.attn_drop(weights) @ v  # the explicit path's attention dropout
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, dim)))

    def attention_weights(self, x, mask=None):
        return sdpa_einsum(*self.split_qkv(x), mask)[1]


class MHAWrong(MHATimmStyle):
    mistake = None

    def forward(self, x, mask=None):
        self.split_qkv(x)  # validates x
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
        out = self.attn_drop(weights) @ v
        out = out.reshape(b, n, dim) if self.mistake == "merge" else ref.merge_heads(out)
        return self.proj_drop(out if self.mistake == "proj" else self.proj(out))


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


# --- more slips, each named (issue "The learner's path") ------------------------------------------------------

def sdpa_scaled_after_softmax(q, k, v, mask=None):
    weights = sdpa(q, k, v, mask, scale=1.0)[1] / math.sqrt(q.shape[-1])
    return weights @ v, weights


def sdpa_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = (scores if mask is None else scores + mask).softmax(-1)
    return weights @ v, weights


def sdpa_half_only(q, k, v, mask=None):
    raise NotImplementedError("\"addmm_impl_cpu_\" not implemented for 'Half'")  # torch's own, not the stub


@pytest.mark.parametrize("impl, hint", [
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=math.sqrt(q.shape[-1])), "multiplied by sqrt"),
    (lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=1 / math.sqrt(q.shape[-2])), "scaled with the wrong size"),
    (sdpa_scaled_after_softmax, "applied after the softmax: scale the scores before it"),
    (sdpa_mask_added, "boolean mask was added to the scores"),
    (sdpa_half_only, r"raised NotImplementedError: .*Half(?s:.*)likely cause: this operation has no float16"),
])
def test_sdpa_rejects_more_mistakes(impl, hint):
    rejects(checks.scaled_dot_product_attention, impl, hint)


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


class SelfAttentionRoles(SelfAttentionSDPA):
    def forward(self, x, mask=None):
        return sdpa(self.q(x), self.v(x), self.k(x), mask)[0]  # keys from v, values from k


class SelfAttentionMaskDropped(SelfAttentionSDPA):
    def forward(self, x, mask=None):
        return sdpa(self.q(x), self.k(x), self.v(x))[0]


class SelfAttentionWeightsAreOutput(SelfAttentionSDPA):
    def attention_weights(self, x, mask=None):
        return self(x, mask)


class SelfAttentionWeightsNoMask(SelfAttentionSDPA):
    def attention_weights(self, x, mask=None):
        return sdpa(self.q(x), self.k(x), self.v(x))[1]


@pytest.mark.parametrize("impl, hint", [
    (SelfAttentionRoles, r"wrong roles \(keys from self.v, values from self.k\)"),
    (SelfAttentionMaskDropped, "mask seems not to reach the attention"),
    (SelfAttentionWeightsAreOutput, r"weights from attention_weights has shape .*\n(.*\n)*.*this is the output"),
    (SelfAttentionWeightsNoMask, "mask seems not to reach the weights"),
])
def test_self_attention_rejects_more(impl, hint):
    rejects(checks.SelfAttention, impl, hint)


def split_no_check(x, h):
    b, n, width = x.shape
    return x[..., : width // h * h].reshape(b, n, h, -1).transpose(1, 2)  # silently drops features


def split_names_one(x, h):
    if x.shape[-1] % h:
        raise ValueError(f"width {x.shape[-1]} cannot be split evenly")
    return ref.split_heads(x, h)


def split_vague_error(x, h):
    if x.shape[-1] % h:
        raise ValueError("bad width")
    return ref.split_heads(x, h)


@pytest.mark.parametrize("impl, hint", [
    (lambda x, h: rearrange(x, "b n (h d) -> b h n d", h=h),
     "a width of 10 is not divisible by 4 heads: expected a ValueError, your code raised EinopsError"),
    (split_no_check, "not divisible by 4 heads: expected a ValueError, your code returned tensor"),
    (split_names_one, "which does not name 4"),
    (split_vague_error, "your ValueError says 'bad width', which does not name 10 and 4"),
    (lambda x, h: rearrange(x, "b n (h d) -> b h n d", d=h), "num_heads was used as the width of a head"),
])
def test_split_heads_rejects_more(impl, hint):
    rejects(checks.split_heads, impl, hint)


def test_merge_heads_message_reads_clearly():
    with pytest.raises(CheckFailed) as info:
        checks.merge_heads(lambda x: x.reshape(x.shape[0], x.shape[2], -1))
    cause = str(info.value).split("likely cause: ")[1]
    assert cause == ("your heads look merged without a transpose: `.reshape(b, n, h * d)` on the (b, h, n, d) "
                     "tensor mixes tokens and heads; first bring the tokens in front of the heads, x.transpose(1, 2) "
                     "gives (b, n, h, d), then flatten the last two axes")
    with pytest.raises(CheckFailed, match="transposed or permuted tensor is not contiguous in memory: use .reshape"):
        checks.merge_heads(lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1))


class MHAFused(nn.Module):
    """The fused kernel, as the exercise asks (a correct variant); ``slip`` names one mistake."""

    slip = None

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        if dim % num_heads and self.slip != "no_init_check":
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(proj_drop)

    def split_qkv(self, x):
        if self.slip != "no_x_check" and (x.ndim != 3 or x.shape[-1] != self.dim):
            raise ValueError(f"expected (b, n, {self.dim}), got {tuple(x.shape)}")
        return rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads).unbind(0)

    def forward(self, x, mask=None):
        q, k, v = self.split_qkv(x)
        p = {"eval_dropout": self.attn_drop.p, "no_dropout": 0.0}.get(
            self.slip, self.attn_drop.p if self.training else 0.0)
        out = self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)))
        return F.dropout(out, self.proj_drop.p) if self.slip == "F.dropout" else self.proj_drop(out)

    def attention_weights(self, x, mask=None):
        weights = sdpa(*self.split_qkv(x), mask)[1]
        if self.slip == "weights_dropout":
            weights = self.attn_drop(weights)
        return weights.mean(1) if self.slip == "weights_mean" else weights


def fused(slip):
    return type("MultiHeadAttention", (MHAFused,), {"slip": slip})


@pytest.mark.parametrize("slip, hint", [
    ("eval_dropout", r"with attn_drop=0.5, in eval mode two calls on the same input gave different outputs"
                     r"(.|\n)*attention dropout is applied in eval mode"),
    ("no_dropout", r"with attn_drop=0.5, in training mode two calls(.|\n)*attn_drop seems ignored"),
    ("F.dropout", r"with proj_drop=0.5, in eval mode(.|\n)*output dropout is applied in eval mode"),
    ("weights_dropout", "attention_weights applies the attention dropout"),
    ("weights_mean", r"one \(n, n\) map per head"),
    ("no_init_check", "dim=10 is not divisible by num_heads=3: expected a ValueError, your code returned"),
    ("no_x_check", "tokens of width 13 .*: expected a ValueError, your code raised RuntimeError"),
])
def test_mha_rejects_more(slip, hint):
    rejects(checks.MultiHeadAttention, fused(slip), hint)


def test_mha_accepts_the_fused_kernel(capsys):
    accepts(checks.MultiHeadAttention, fused(None), capsys)


# --- the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame --------

def sdpa_kT(q, k, v, mask=None):
    scores = q @ k.T / math.sqrt(q.shape[-1])  # fine for 2-D k, wrong for a batch
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights


def sdpa_mask_always(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights


def sdpa_detached_scores(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).detach()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights


@torch.no_grad()
def sdpa_no_grad(q, k, v, mask=None):
    return sdpa(q, k, v, mask)


def sdpa_numpy(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = np.exp(scores.numpy() - scores.numpy().max(-1, keepdims=True))
    weights = torch.from_numpy(e / e.sum(-1, keepdims=True))
    return weights @ v, weights


def sdpa_numpy_detached(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.from_numpy(scores.detach().numpy()).softmax(-1)
    return weights @ v, weights


def sdpa_data(q, k, v, mask=None):
    return sdpa(q.data, k, v, mask)


class SelfAttentionSlip(SelfAttentionSDPA):
    """The course's SelfAttention with one slip; the attention_weights method stays correct."""

    slip = None

    def forward(self, x, mask=None):
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.slip == "values_from_k":
            v = k
        elif self.slip == "qk_swapped":
            q, k = k, q
        elif self.slip == "q_detached":
            q = q.detach()
        elif self.slip == "v_weight_data":
            v = F.linear(x, self.v.weight.data)
        elif self.slip == "in_place":
            x /= math.sqrt(x.shape[-1])
        if self.slip == "no_grad":
            with torch.no_grad():
                return sdpa(q, k, v, mask)[0]
        return sdpa(q, k, v, mask)[0]


def self_attention(slip):
    return type("SelfAttention", (SelfAttentionSlip,), {"slip": slip})


def split_detached(x, h):
    return ref.split_heads(x.detach(), h)


def split_in_place(x, h):
    if x.shape[-1] % h:
        raise ValueError(f"width {x.shape[-1]} is not divisible by num_heads={h}")
    return x.unflatten_(-1, (h, -1)).transpose(1, 2) if hasattr(x, "unflatten_") else x.unsqueeze_(0)[0].unflatten(
        -1, (h, -1)).transpose(1, 2)


def merge_in_place(x):
    return x.transpose_(1, 2).flatten(2)


class MHASlip(MHAFused):
    """The fused-kernel MultiHeadAttention of the statement, with one more slip."""

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop)
        if self.slip == "no_head_dim":
            del self.head_dim

    def split_qkv(self, x):
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError("bad tokens" if self.slip == "vague_error" else f"expected (b, n, {self.dim}), got "
                             f"{tuple(x.shape)}")
        qkv = self.qkv(x).detach() if self.slip == "qkv_detached" else self.qkv(x)
        layout = "h three d" if self.slip == "split_order" else "three h d"
        return rearrange(qkv, f"b n ({layout}) -> three b h n d", three=3, h=self.num_heads).unbind(0)

    def forward(self, x, mask=None):
        if self.slip == "in_place":
            x *= 1.0 + 1e-3
        if self.slip == "no_mask":
            mask = None
        return super().forward(x, mask)


def mha(slip):
    return type("MultiHeadAttention", (MHASlip,), {"slip": slip})


class MHANoSplit(MHAFused):
    split_qkv = None

    def forward(self, x, mask=None):
        return ref.MultiHeadAttention.forward(self, x, mask)

    def attention_weights(self, x, mask=None):
        return ref.MultiHeadAttention.attention_weights(self, x, mask)


MHANoSplit.split_qkv = None


GRAD = r"look for `.detach\(\)`, `.data`, `torch.no_grad\(\)` or a detour through numpy"
SLIPS = [
    slip("scaled_dot_product_attention", "output", "k.T", sdpa_kT,
         r"at line \d+ of your code: scores = q @ k.T(.|\n)*likely cause: `.T` reverses all the axes"),
    slip("scaled_dot_product_attention", "output", "mask_always", sdpa_mask_always,
         r"bad operand type for unary ~: 'NoneType'(.|\n)*likely cause: the mask is optional: apply it only `if "
         r"mask is not None`"),
    slip("scaled_dot_product_attention", "output", "no_scale", lambda q, k, v, mask=None: sdpa(q, k, v, mask, 1.0),
         "without the 1/sqrt"),
    slip("scaled_dot_product_attention", "output", "axis", lambda q, k, v, mask=None: sdpa(q, k, v, mask, axis=-2),
         "wrong axis"),
    slip("scaled_dot_product_attention", "plain", "fused", sdpa_torch_out,
         r"calls PyTorch's fused F.scaled_dot_product_attention(.|\n)*plain tensor operations"),
    slip("scaled_dot_product_attention", "mask", "inverted",
         lambda q, k, v, mask=None: sdpa(q, k, v, mask, invert=True), "inverted"),
    slip("scaled_dot_product_attention", "mask", "zero", lambda q, k, v, mask=None: sdpa(q, k, v, mask, fill=0.0),
         "instead of -inf"),
    slip("scaled_dot_product_attention", "gradient", "detach", sdpa_detached_scores,
         "no gradient reaches `q`: " + GRAD + r"(.|\n)*likely cause: in your code, line \d+: `scores = \(q @ k"),
    slip("scaled_dot_product_attention", "gradient", "no_grad", sdpa_no_grad,
         r"the output carries no gradient at all(.|\n)*@torch.no_grad\(\)"),
    slip("scaled_dot_product_attention", "gradient", "numpy", sdpa_numpy,
         r"Can't call numpy\(\)(.|\n)*likely cause: a detour through numpy"),
    slip("scaled_dot_product_attention", "gradient", "numpy_detached", sdpa_numpy_detached,
         r"no gradient reaches `q`(.|\n)*\.detach\(\)\.numpy\(\)"),
    slip("scaled_dot_product_attention", "gradient", "data", sdpa_data,
         r"no gradient reaches `q`(.|\n)*line \d+: `return sdpa\(q.data"),
    slip("scaled_dot_product_attention", "inputs", "in_place", _inplace, "changed its input `q` in place"),
    slip("scaled_dot_product_attention", None, "stub", _not_done, "not done yet"),
    slip("SelfAttention", "names", "bias", SelfAttentionBias, "no bias"),
    slip("SelfAttention", "output", "values_from_k", self_attention("values_from_k"),
         r"wrong roles \(values from self.k\)"),
    slip("SelfAttention", "output", "qk_swapped", self_attention("qk_swapped"), "queries and keys look swapped"),
    slip("SelfAttention", "mask", "mask_dropped", SelfAttentionMaskDropped, "mask seems not to reach the attention"),
    slip("SelfAttention", "attention_weights", "missing", SelfAttentionOldAPI,
         r"has no method attention_weights(.|\n)*write attention_weights\(x, mask=None\)"),
    slip("SelfAttention", "attention_weights", "output_returned", SelfAttentionWeightsAreOutput, "this is the output"),
    slip("SelfAttention", "gradient", "q_detached", self_attention("q_detached"),
         "no gradient reaches `q.weight`: " + GRAD + r"(.|\n)*q = q.detach\(\)"),
    slip("SelfAttention", "gradient", "v_weight_data", self_attention("v_weight_data"),
         r"no gradient reaches `v.weight`(.|\n)*self.v.weight.data"),
    slip("SelfAttention", "gradient", "no_grad", self_attention("no_grad"), r"carries no gradient at all"),
    slip("SelfAttention", "inputs", "in_place", self_attention("in_place"), "changed its input `x` in place"),
    slip("split_heads", "output", "view", split_view, "without a transpose"),
    slip("split_heads", "error", "names_one", split_names_one, "which does not name 4"),
    slip("split_heads", "error", "no_check", split_no_check, "expected a ValueError, your code returned tensor"),
    slip("split_heads", "gradient", "detach", split_detached, r"carries no gradient(.|\n)*x.detach\(\)"),
    slip("split_heads", "inputs", "in_place", split_in_place, "changed its input `x` in place"),
    slip("merge_heads", "output", "no_transpose", lambda x: x.reshape(x.shape[0], x.shape[2], -1),
         "without a transpose"),
    slip("merge_heads", "gradient", "detach", lambda x: ref.merge_heads(x).detach(), "carries no gradient"),
    slip("merge_heads", "inputs", "in_place", merge_in_place, "changed its input `x` in place"),
    slip("MultiHeadAttention", "names", "separate", MHASeparate, "one fused Linear `qkv`"),
    slip("MultiHeadAttention", "attributes", "no_head_dim", mha("no_head_dim"),
         r"head_dim should be 4, got None(.|\n)*self.head_dim = dim // num_heads"),
    slip("MultiHeadAttention", "split_qkv", "order", mha("split_order"), "q, k and v from split_qkv(.|\n)*wrong order"),
    slip("MultiHeadAttention", "split_qkv", "missing", MHANoSplit, "has no method split_qkv"),
    slip("MultiHeadAttention", "output", "no_proj", mha_with("proj"), "`proj` seems to be missing"),
    slip("MultiHeadAttention", "mask", "no_mask", mha("no_mask"), "mask seems to be ignored"),
    slip("MultiHeadAttention", "attention_weights", "mean", fused("weights_mean"), r"one \(n, n\) map per head"),
    slip("MultiHeadAttention", "dropout", "eval_dropout", fused("eval_dropout"), "attention dropout is applied in "
         "eval"),
    slip("MultiHeadAttention", "error-dim", "no_init_check", fused("no_init_check"),
         "dim=10 is not divisible by num_heads=3: expected a ValueError"),
    slip("MultiHeadAttention", "error-shape", "no_x_check", fused("no_x_check"),
         r"tokens of width 13 .*expected a ValueError, your code raised RuntimeError(.|\n)*split_qkv"),
    slip("MultiHeadAttention", "error-shape", "vague", mha("vague_error"),
         r"your ValueError says 'bad tokens', which does not name \(2, 5, 13\)"),
    slip("MultiHeadAttention", "gradient", "qkv_detached", mha("qkv_detached"),
         r"no gradient reaches `qkv.weight`(.|\n)*self.qkv\(x\).detach\(\)"),
    slip("MultiHeadAttention", "inputs", "in_place", mha("in_place"), "changed its input `x` in place"),
]
