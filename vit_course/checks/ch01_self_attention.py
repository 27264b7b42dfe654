"""Chapter 01's exercises: scaled_dot_product_attention and SelfAttention, their checks, rules and catalogue of
slips, each a wrong solution written out whole and named after its mistake (a check names the slip whose output the
learner's matches). Chapter 02 reuses the hints, ``attention`` (the reference with the knobs its own slips turn) and
``random_mask``; chapter 03 ``random_mask``."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import attention as ref
from .core import DOUBLE, IN_PLACE, NAN, TUPLE, Slip, Variant, check
from .gradients import CUT_AT, gradient_flow
from .messages import known
from .modules import WEIGHTS_MASK, check_attention_weights, only_biases, twins
from .probes import TorchCalls

NO_SCALE = "this is the output without the 1/sqrt(d) scaling: divide the scores q k^T by sqrt(d), d = q's last size"
TIMES = "the scores look multiplied by sqrt(d): divide them by sqrt(d), d = q's last size"
BY_DV = ("the scores are scaled with the wrong size (the values' width or a number of tokens): the scale is "
         "1/sqrt(d), d = q's last size")
AFTER_SOFTMAX = "the 1/sqrt(d) scaling is applied after the softmax: scale the scores before it"
WRONG_AXIS = "softmax over the wrong axis: each query's weights must sum to 1 over the keys, the last axis (dim=-1)"
INVERTED = "the mask looks inverted: True means 'may attend', so fill the scores where the mask is False"
IGNORED = "the mask seems to be ignored: set the scores where the mask is False to -inf before the softmax"
ZEROED = "masked scores were set to 0 instead of -inf: exp(0) = 1 still gives them weight"
AFTER = "the mask was applied after the softmax: mask the scores before it, so the rows still sum to 1"
LOG = "these are log-probabilities (log_softmax): the weights are the softmax of the scores, each row summing to 1"
SCORES_OUT = "the output multiplies the scores by v: multiply the weights (after the softmax), `weights @ v`"
QK_SWAPPED = "queries and keys look swapped: scores are q k^T, one row per query"
NO_TRANSPOSE = ("your heads look reshaped without a transpose: `.view(b, h, n, d)` mixes tokens and heads; "
                "reshape to (b, n, h, d) first, then transpose tokens and heads")
INTERLEAVED = ("your heads take every h-th feature: head i should own the i-th contiguous block of d features, "
               "the pattern 'b n (h d) -> b h n d'")


def attention(q, k, v, mask=None, scale=None, axis=-1, mask_mode="ok", late_scale=None, norm="softmax",
              out_from="weights", scores=None):
    """Reference attention with the knobs learners get wrong, for chapter 02's MultiHeadAttention slips (this
    chapter's slips are written out whole below): (out, weights). ``scores``: scores computed elsewhere (then
    ``scale`` scales them); norm="scores": the weights are the masked scores."""
    scores = (q @ k.transpose(-2, -1) if scores is None else scores) * (
        1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and mask_mode == "ok":
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask, float("-inf"))
    elif mask is not None and mask_mode == "zero":
        scores = scores.masked_fill(~mask, 0.0)
    elif mask is not None and mask_mode == "added":
        scores = scores + mask
    weights = {"softmax": scores.softmax, "log": scores.log_softmax, "scores": lambda a: scores,
               "sum": lambda a: scores / scores.sum(a, keepdim=True)}[norm](axis)
    weights = weights * (1.0 if late_scale is None else late_scale)
    if mask is not None and mask_mode == "after":
        weights = weights * mask
    return (scores if out_from == "scores" else weights) @ v, weights


def _named(which, *inputs):
    """(slip, thunk) pairs for ``close``: the output (which=0) or the weights (which=1) that each slip of
    scaled_dot_product_attention gives on the learner's input (k.T left out: it warns on batches)."""
    return [(s, lambda s=s: s.impl(*inputs)[which]) for s in SLIPS
            if s.exercise == SDPA and s.rule in ("output", "mask") and s.name != "k.T"]


def random_mask(shape, generator, p=0.5):
    """A random boolean mask (True = may attend) in which every query may attend to at least key 0."""
    mask = torch.rand(shape, generator=generator) > p
    mask[..., 0] = True
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
NOT_PASSED = "the mask seems not to reach the attention: pass it on, scaled_dot_product_attention(q, k, v, mask)"
PRODUCT = ("the scores are q times the keys with their last two axes swapped, (..., n_q, d) @ (..., d, n_k): "
           "`q @ k.transpose(-2, -1)`")
MASK_ARGUMENT = "the mask is optional: give the function the statement's signature, (q, k, v, mask=None)"
ERRORS = (("cannot be multiplied", PRODUCT), ("must match the size of tensor", PRODUCT),
          ("positional arguments but", MASK_ARGUMENT), ("unexpected keyword argument 'mask'", MASK_ARGUMENT))


WEIGHTS_FIRST = "you returned (weights, out): the output comes first"
PAIR = "return both: `return weights @ v, weights`"
FUSED = ("write the steps with plain tensor operations (@, .transpose, .softmax, .masked_fill), as the exercise asks: "
         "the check compares yours against the fused function")


def _pair(c, out):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = "None" if out is None else f"a {type(out).__name__}"
        c.fail(f"should return a pair (out, weights), got {got}", PAIR)
    return out


@check("scaled_dot_product_attention")
def scaled_dot_product_attention(c, fn):
    """softmax(q k^T / sqrt(d)) v on awkward shapes, with plain tensor operations, with and without boolean masks
    (True = may attend); gradients reach q, k and v."""
    g = torch.Generator().manual_seed(1)
    for q_shape, k_shape, v_shape, mask_shape in SDPA_CASES:
        q, k, v = (torch.randn(s, generator=g) * 1.5 for s in (q_shape, k_shape, v_shape))
        mask = None
        c.phase("output" if mask_shape is None else "mask")
        if mask_shape == "causal":
            mask = torch.ones(q_shape[-2], k_shape[-2], dtype=torch.bool).tril()
        elif mask_shape is not None:
            mask = random_mask(mask_shape, g, p=0.4)
        with TorchCalls() as calls:
            out = c.call(fn, q, k, v, errors=ERRORS) if mask is None else c.call(fn, q, k, v, mask, errors=ERRORS)
        expected_out, expected_weights = ref.scaled_dot_product_attention(q, k, v, mask)
        c.phase("plain")
        c.ok("scaled_dot_product_attention" not in calls.names, "your function calls PyTorch's fused "
             "F.scaled_dot_product_attention", FUSED)
        c.phase("output" if mask_shape is None else "mask")
        got_out, got_weights = _pair(c, out)
        c.close(got_weights, expected_weights, "attention weights", _named(1, q, k, v, mask))
        c.close(got_weights.sum(-1), torch.ones(expected_weights.shape[:-1]), "row sums of the weights")
        c.close(got_out, expected_out, "output", _named(0, q, k, v, mask))
        torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        c.close(got_out, torch_out, "output (against torch.nn.functional.scaled_dot_product_attention)")
        if mask_shape in (None, (5, 7)) and len(q_shape) == 3:  # gradients, without and with a mask
            masks = [mask][:mask is not None]  # no mask argument where the case has none
            gradient_flow(c, fn, lambda t, m=mask: _pair(c, c.call(fn, t["q"], t["k"], t["v"], *masks))[0],
                          lambda t, m=mask: ref.scaled_dot_product_attention(t["q"], t["k"], t["v"], m)[0],
                          dict(q=q, k=k, v=v))


ROLES, ROLES_FIX = ("the layers play the wrong roles", "queries come from self.q(x), keys from self.k(x), values from "
                     "self.v(x)")
NO_BIAS = "the q, k and v layers have no bias: nn.Linear(dim, head_dim, bias=False)"
BY_DIM = "the scores are scaled by 1/sqrt(dim): use the width of the queries, 1/sqrt(head_dim)"
WEIGHTS_NOT_OUTPUT = "this is the output: return the (b, n, n) weights"
NAMES = "name the three layers q, k and v"
WEIGHTS_REQUIRED = "attention_weights(x, mask=None) returning the (b, n, n) weights"


@check("SelfAttention")
def SelfAttention(c, cls):
    """SelfAttention(dim, head_dim): bias-free Linear layers q, k, v; forward(x, mask=None) -> (b, n, head_dim);
    attention_weights(x, mask=None) -> (b, n, n); gradients reach x and the three layers."""
    g = torch.Generator().manual_seed(2)
    slips = [s for s in SLIPS if s.exercise == "SelfAttention" and s.rule != "inputs"]  # in_place would change x
    for dim, head_dim, batch, n in ((10, 6, 2, 7), (4, 9, 3, 1), (16, 8, 1, 5)):
        reference = ref.SelfAttention(dim, head_dim).eval()
        model = c.build(cls, dim, head_dim)
        c.load(model, reference, [
            (only_biases, NO_BIAS),
            ("", NAMES)])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"SelfAttention({dim}, {head_dim})"
        with torch.no_grad():
            q, k, v = reference.q(x), reference.k(x), reference.v(x)
            expected, weights = ref.scaled_dot_product_attention(q, k, v)
            c.close(c.call(model, x, label=label), expected, "output", twins(slips, reference, (dim, head_dim), x)
                    + _named(0, q, k, v))
            c.phase("mask")
            mask = random_mask((n, n), g)
            masked_out, masked_weights = ref.scaled_dot_product_attention(q, k, v, mask)
            got = c.call(model, x, mask=mask, label=label)
            c.close(got, masked_out, "output with a mask", twins(slips, reference, (dim, head_dim), x, mask)
                    + _named(0, q, k, v, mask))
            c.phase("attention_weights")
            check_attention_weights(c, model, x, weights, label, mask, masked_weights,
                                    [((batch, n, head_dim), WEIGHTS_NOT_OUTPUT)], required=WEIGHTS_REQUIRED)
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label),
                      lambda t: reference(t["x"]), dict(x=x), model, reference)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "scaled_dot_product_attention": ("output", "plain", "mask", "gradient"),
    "SelfAttention": ("names", "output", "mask", "attention_weights", "gradient"),
}


# ---- the catalogue: each slip once, written out whole as the learner would write it (named after the mistake),
# with the rule it breaks and the hint it earns; then the accepted variants.

# scaled_dot_product_attention: the scale
def sdpa_no_scale(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)  # no 1/sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_divided_by_d(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1]  # d, not sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_times_sqrt_d(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_scaled_by_value_width(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])  # d_v, not q's d
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_scaled_by_key_count(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])  # n_k, not d
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_scaled_by_query_count(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-2])  # n_q, not d
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_scaled_after_softmax(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1) / math.sqrt(q.shape[-1])  # the weights scaled, not the scores
    return weights @ v, weights


def sdpa_scaled_queries_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])  # changes the caller's q
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


# the softmax and the product with v
def sdpa_softmax_over_queries(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-2)  # columns sum to 1, not rows
    return weights @ v, weights


def sdpa_log_softmax(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.log_softmax(dim=-1)
    return weights @ v, weights


def sdpa_divided_by_sum(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores / scores.sum(dim=-1, keepdim=True)  # no exp
    return weights @ v, weights


def sdpa_scores_times_v(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return scores @ v, weights  # the scores, not the weights


def sdpa_keys_times_queries(q, k, v, mask=None):
    scores = k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])  # one row per key
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_k_dot_T(q, k, v, mask=None):
    scores = q @ k.T / math.sqrt(q.shape[-1])  # .T reverses every axis of a batch
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_transpose_1_2(q, k, v, mask=None):
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # right for (b, n, d) only
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_bmm(q, k, v, mask=None):
    scores = torch.bmm(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # 3-D inputs only
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


# what it returns
def sdpa_weights_first(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights, weights @ v


def sdpa_output_only(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def sdpa_float64(q, k, v, mask=None):
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v.double(), weights


def sdpa_divided_by_zero(q, k, v, mask=None):
    d = torch.tensor(q.shape[-1] - k.shape[-1], dtype=q.dtype)  # 0: two widths subtracted, not one width
    scores = q @ k.transpose(-2, -1) / d.sqrt()  # inf and nan scores
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_half_only(q, k, v, mask=None):
    raise NotImplementedError("\"addmm_impl_cpu_\" not implemented for 'Half'")  # torch's own, not the stub


def sdpa_stub(q, k, v, mask=None):
    raise NotImplementedError("scaled_dot_product_attention")


def sdpa_fused(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # the function the check compares against
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return out, scores.softmax(dim=-1)


# the mask
def sdpa_without_mask_argument(q, k, v):
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(dim=-1)
    return weights @ v, weights


def sdpa_mask_always_applied(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))  # fails when mask is None
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_mask_inverted(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # blocks where attending is allowed
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_mask_ignored(q, k, v, mask=None):
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(dim=-1)
    return weights @ v, weights


def sdpa_masked_to_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)  # exp(0) = 1: still weighted
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_mask_after_softmax(q, k, v, mask=None):
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(dim=-1)
    if mask is not None:
        weights = weights * mask  # rows no longer sum to 1
    return weights @ v, weights


def sdpa_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask  # True counts as 1
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


# the gradient
def sdpa_scores_detached(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).detach()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


@torch.no_grad()
def sdpa_no_grad(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_numpy_softmax(q, k, v, mask=None):
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
    weights = torch.from_numpy(scores.detach().numpy()).softmax(dim=-1)
    return weights @ v, weights


def sdpa_q_data(q, k, v, mask=None):
    scores = q.data @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


SDPA = "scaled_dot_product_attention"
SLIPS = [Slip(SDPA, name, rule, hint, impl) for name, rule, hint, impl in [
    ("no_scale", "output", NO_SCALE, sdpa_no_scale),
    ("by_d", "output", "the scores look divided by d instead of sqrt(d)", sdpa_divided_by_d),
    ("times", "output", TIMES, sdpa_times_sqrt_d),
    ("by_dv", "output", BY_DV, sdpa_scaled_by_value_width),
    ("by_keys", "output", BY_DV, sdpa_scaled_by_key_count),
    ("by_tokens", "output", BY_DV, sdpa_scaled_by_query_count),
    ("after_softmax", "output", AFTER_SOFTMAX, sdpa_scaled_after_softmax),
    ("axis", "output", WRONG_AXIS, sdpa_softmax_over_queries),
    ("log_softmax", "output", LOG, sdpa_log_softmax),
    ("sum", "output", "the scores are divided by their sum: the weights are their softmax, exp(scores) normalised, "
     "`scores.softmax(dim=-1)`", sdpa_divided_by_sum),
    ("scores_out", "output", SCORES_OUT, sdpa_scores_times_v),
    ("swapped", "output", PRODUCT, sdpa_keys_times_queries),
    ("weights_first", "output", WEIGHTS_FIRST, sdpa_weights_first),
    ("out_only", "output", PAIR, sdpa_output_only),
    ("double", "output", DOUBLE, sdpa_float64),
    ("nan", "output", NAN, sdpa_divided_by_zero),
    ("k.T", "output", known(r"\.T\b"), sdpa_k_dot_T),  # fine for 2-D k, wrong for a batch
    ("transpose_1_2", "output", known("Dimension out of range"), sdpa_transpose_1_2),  # fine for 3-D only
    ("bmm", "output", known("must be a 3D tensor"), sdpa_bmm),
    ("half_only", "output", known("not implemented for 'Half'"), sdpa_half_only),
    ("mask_always", "output", known("bad operand type for unary ~: 'NoneType'"), sdpa_mask_always_applied),
    ("fused", "plain", FUSED, sdpa_fused),
    ("no_mask_argument", "mask", MASK_ARGUMENT, sdpa_without_mask_argument),
    ("inverted", "mask", INVERTED, sdpa_mask_inverted),
    ("ignored", "mask", IGNORED, sdpa_mask_ignored),
    ("zero", "mask", ZEROED, sdpa_masked_to_zero),
    ("after", "mask", AFTER, sdpa_mask_after_softmax),
    ("added", "mask", "the boolean mask was added to the scores (True counts as 1): fill the scores where the mask "
     "is False with -inf instead", sdpa_mask_added),
    ("detach", "gradient", CUT_AT, sdpa_scores_detached),
    ("no_grad", "gradient", CUT_AT, sdpa_no_grad),
    ("numpy", "gradient", known("Can't call numpy() on Tensor that requires grad"), sdpa_numpy_softmax),
    ("numpy_detached", "gradient", CUT_AT, sdpa_numpy_detached),
    ("data", "gradient", CUT_AT, sdpa_q_data),
    ("in_place", "inputs", IN_PLACE, sdpa_scaled_queries_in_place),
]] + [Slip(SDPA, "stub", None, "not done yet", sdpa_stub)]


# SelfAttention: each slip a whole class; the constructor is the statement's unless the slip is in it
class _Head(nn.Module):
    """The statement's constructor: three bias-free Linear layers q, k and v, dim -> head_dim."""

    def __init__(self, dim, head_dim):
        super().__init__()
        self.q = nn.Linear(dim, head_dim, bias=False)
        self.k = nn.Linear(dim, head_dim, bias=False)
        self.v = nn.Linear(dim, head_dim, bias=False)


class SelfAttentionWithBias(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.q = nn.Linear(dim, head_dim)  # bias=True, the default
        self.k = nn.Linear(dim, head_dim)
        self.v = nn.Linear(dim, head_dim)

    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionNoScale(_Head):
    def forward(self, x, mask=None):
        return sdpa_no_scale(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return sdpa_no_scale(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionScaledByDim(_Head):
    def forward(self, x, mask=None):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])  # dim, the input's width, not head_dim
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1) @ v

    def attention_weights(self, x, mask=None):
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)


class SelfAttentionSoftmaxOverQueries(_Head):
    def forward(self, x, mask=None):
        return sdpa_softmax_over_queries(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return sdpa_softmax_over_queries(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionMaskInverted(_Head):
    def forward(self, x, mask=None):
        return sdpa_mask_inverted(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return sdpa_mask_inverted(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionUnprojected(_Head):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(x, x, x, mask)[0]  # x itself, not self.q(x), ...

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(x, x, x, mask)[1]


class SelfAttentionReturnsPair(_Head):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)  # (out, weights)

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionMaskDropped(_Head):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x))[0]  # mask not passed on

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionWithoutWeights(_Head):  # forward only, no attention_weights
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]


class SelfAttentionWeightsAreOutput(_Head):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return self(x, mask)  # the output, (b, n, head_dim)


class SelfAttentionWeightsIgnoreMask(_Head):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x))[1]  # mask not passed on


class SelfAttentionQueriesDetached(_Head):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x).detach(), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionValueWeightData(_Head):
    def forward(self, x, mask=None):
        v = F.linear(x, self.v.weight.data)  # .data: no gradient reaches self.v
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), v, mask)[0]

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionNoGrad(_Head):
    def forward(self, x, mask=None):
        with torch.no_grad():
            return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionScalesInputInPlace(_Head):
    def forward(self, x, mask=None):
        x /= math.sqrt(x.shape[-1])  # changes the caller's x
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionRoles(_Head):
    """The three layers in the wrong roles: queries, keys and values from the layers named by ``roles`` (e.g. "kqv":
    queries from self.k, keys from self.q); the catalogue holds one subclass for each of the 26 wrong orders."""

    roles = "qkv"

    def forward(self, x, mask=None):
        q, k, v = (getattr(self, layer)(x) for layer in self.roles)
        return ref.scaled_dot_product_attention(q, k, v, mask)[0]

    def attention_weights(self, x, mask=None):
        q, k, v = (getattr(self, layer)(x) for layer in self.roles)
        return ref.scaled_dot_product_attention(q, k, v, mask)[1]


def _roles(roles):
    """The hint for the projections used in the wrong ``roles`` (the layers giving queries, keys and values)."""
    wrong = [f"{what} from self.{used}" for what, used, right in zip(("queries", "keys", "values"), roles, "qkv",
                                                                      strict=True) if used != right]
    return QK_SWAPPED if roles == "kqv" else f"{ROLES} ({', '.join(wrong)}): {ROLES_FIX}"


SLIPS += [Slip("SelfAttention", name, rule, hint, impl) for name, rule, hint, impl in [
    ("linear", "names", NAMES, nn.Linear),
    ("no_scale", "output", NO_SCALE, SelfAttentionNoScale),
    ("axis", "output", WRONG_AXIS, SelfAttentionSoftmaxOverQueries),
    ("inverted", "mask", INVERTED, SelfAttentionMaskInverted),
    ("bias", "names", NO_BIAS, SelfAttentionWithBias),
    ("by_dim", "output", BY_DIM, SelfAttentionScaledByDim),
    ("unprojected", "output", "this is attention on x itself: project x with self.q, self.k and self.v first",
     SelfAttentionUnprojected),
    ("pair", "output", TUPLE, SelfAttentionReturnsPair),
    ("mask_dropped", "mask", NOT_PASSED, SelfAttentionMaskDropped),
    ("missing", "attention_weights", WEIGHTS_REQUIRED, SelfAttentionWithoutWeights),
    ("output_returned", "attention_weights", WEIGHTS_NOT_OUTPUT, SelfAttentionWeightsAreOutput),
    ("weights_no_mask", "attention_weights", WEIGHTS_MASK, SelfAttentionWeightsIgnoreMask),
    ("q_detached", "gradient", CUT_AT, SelfAttentionQueriesDetached),
    ("v_weight_data", "gradient", CUT_AT, SelfAttentionValueWeightData),
    ("no_grad", "gradient", CUT_AT, SelfAttentionNoGrad),
    ("in_place", "inputs", IN_PLACE, SelfAttentionScalesInputInPlace),
]] + [Slip("SelfAttention", {"qkk": "values_from_k", "qvk": "roles", "kqv": "qk_swapped"}.get(roles, f"roles_{roles}"),
           "output", _roles(roles), type(f"SelfAttentionRoles_{roles}", (SelfAttentionRoles,), {"roles": roles}))
      for roles in map("".join, itertools.product("qkv", repeat=3)) if roles != "qkv"]  # three keep their first names


# the variants: correct implementations the statements allow
def _sdpa_einsum(q, k, v, mask=None):
    q = q / q.shape[-1] ** 0.5  # pre-scaled queries
    scores = torch.einsum("...id,...jd->...ij", q, k)
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...ij,...jd->...id", weights, v), weights


def sdpa_knobs_at_rest(q, k, v, mask=None):
    """``attention`` (chapter 02's slips build on it) with every knob at its correct setting."""
    return attention(q, k, v, mask)


class SelfAttentionEinsum(_Head):
    def forward(self, x, mask=None):
        return _sdpa_einsum(self.q(x), self.k(x), self.v(x), mask)[0]

    def attention_weights(self, x, mask=None):
        return _sdpa_einsum(self.q(x), self.k(x), self.v(x), mask)[1]


class SelfAttentionOneCall(_Head):
    """q, k and v computed once, in a helper both methods share."""

    def _attend(self, x, mask):
        return ref.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)

    def forward(self, x, mask=None):
        out, _ = self._attend(x, mask)
        return out

    def attention_weights(self, x, mask=None):
        return self._attend(x, mask)[1]


VARIANTS = [Variant(SDPA, "reference", ref.scaled_dot_product_attention), Variant(SDPA, "einsum", _sdpa_einsum),
            Variant(SDPA, "knobs", sdpa_knobs_at_rest), Variant("SelfAttention", "reference", ref.SelfAttention),
            Variant("SelfAttention", "sdpa", SelfAttentionEinsum),  # the einsum attention
            Variant("SelfAttention", "one_call", SelfAttentionOneCall)]
