"""Chapter 01's checks (scaled_dot_product_attention, SelfAttention) catch the usual mistakes and accept
correct variants."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects, slip


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


def sdpa_scaled_after_softmax(q, k, v, mask=None):
    weights = sdpa(q, k, v, mask, scale=1.0)[1] / math.sqrt(q.shape[-1])
    return weights @ v, weights


def sdpa_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = (scores if mask is None else scores + mask).softmax(-1)
    return weights @ v, weights


def sdpa_half_only(q, k, v, mask=None):
    raise NotImplementedError("\"addmm_impl_cpu_\" not implemented for 'Half'")  # torch's own, not the stub


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


def sdpa_kT(q, k, v, mask=None):
    scores = q @ k.T / math.sqrt(q.shape[-1])  # fine for 2-D k, wrong for a batch
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights


def sdpa_transpose_1_2(q, k, v, mask=None):
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # fine for a 3-D batch, not for 2-D or 4-D inputs
    scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights


def sdpa_bmm(q, k, v, mask=None):
    scores = torch.bmm(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # 3-D batches only
    scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return torch.bmm(weights, v), weights


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


GRAD = r"look for `.detach\(\)`, `.data`, `torch.no_grad\(\)` or a detour through numpy"


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
def sdpa_log_softmax(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    weights = scores.log_softmax(-1)
    return weights @ v, weights


SLIPS = [
    slip("scaled_dot_product_attention", "output", "log_softmax", sdpa_log_softmax, "these are log-probabilities"),
    slip("scaled_dot_product_attention", "output", "k.T", sdpa_kT,
         r"at line \d+ of your code: scores = q @ k.T(.|\n)*likely cause: `.T` reverses all the axes"),
    slip("scaled_dot_product_attention", "output", "transpose_1_2", sdpa_transpose_1_2,
         r"Dimension out of range(.|\n)*likely cause: an axis number the tensor does not have(.|\n)*"
         r"transpose\(-2, -1\)"),
    slip("scaled_dot_product_attention", "output", "bmm", sdpa_bmm,
         r"must be a 3D tensor(.|\n)*likely cause: torch.bmm takes 3-D batches only"),
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
]


# folded from the parametrized tests: each rejected under the rule the check blames
SLIPS += [
    slip("scaled_dot_product_attention", "output", "sdpa_rejects_more_mistakes_0",
         lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=math.sqrt(q.shape[-1])),
         "multiplied by sqrt"),
    slip("scaled_dot_product_attention", "output", "sdpa_rejects_more_mistakes_1",
         lambda q, k, v, mask=None: sdpa(q, k, v, mask, scale=1 / math.sqrt(q.shape[-2])),
         "scaled with the wrong size"),
    slip("scaled_dot_product_attention", "output", "sdpa_rejects_more_mistakes_2", sdpa_scaled_after_softmax,
         "applied after the softmax: scale the scores before it"),
    slip("scaled_dot_product_attention", "mask", "sdpa_rejects_more_mistakes_3", sdpa_mask_added,
         "boolean mask was added to the scores"),
    slip("scaled_dot_product_attention", "output", "sdpa_rejects_more_mistakes_4", sdpa_half_only,
         r"raised NotImplementedError: .*Half(?s:.*)likely cause: this operation has no float16"),
    slip("SelfAttention", "output", "self_attention_rejects_more_0", SelfAttentionRoles,
         r"wrong roles \(keys from self.v, values from self.k\)"),
    slip("SelfAttention", "attention_weights", "self_attention_rejects_more_3", SelfAttentionWeightsNoMask,
         "mask seems not to reach the weights"),
]
