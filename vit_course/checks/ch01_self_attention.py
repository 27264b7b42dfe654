"""Chapter 01's exercises: scaled_dot_product_attention and SelfAttention, their checks, rules and
the usual attention slips (their hints and attention computed with each, so a check can name the slip whose output
the learner's matches; chapters 02-03 reuse them)."""

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
    """Reference attention with the knobs learners get wrong (diagnoses and slips): (out, weights). ``scores``:
    scores computed elsewhere (then ``scale`` scales them); norm="scores": the weights are the masked scores."""
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
PRODUCT = ("the scores are q times the keys with their last two axes swapped, (..., m_q, d) @ (..., d, m_k): "
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
WEIGHTS_NOT_OUTPUT = "this is the output: return the (b, m, m) weights"
NAMES = "name the three layers q, k and v"
WEIGHTS_REQUIRED = "attention_weights(x, mask=None) returning the (b, m, m) weights"


@check("SelfAttention")
def SelfAttention(c, cls):
    """SelfAttention(dim, head_dim): bias-free Linear layers q, k, v; forward(x, mask=None) -> (b, m, head_dim);
    attention_weights(x, mask=None) -> (b, m, m); gradients reach x and the three layers."""
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


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
def _sdpa(swap=False, **knobs):
    """scaled_dot_product_attention with the slip ``knobs`` of ``attention`` (a knob given as a function of q, k and
    v is computed from them); ``swap``: q and k swapped."""
    def scaled_dot_product_attention(q, k, v, mask=None):
        kw = {key: value(q, k, v) if callable(value) else value for key, value in knobs.items()}
        return attention(*((k, q) if swap else (q, k)), v, mask, **kw)
    return scaled_dot_product_attention


def _sdpa_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])
    return attention(q, k, v, mask, scale=1.0)


def _sdpa_stub(q, k, v, mask=None):
    raise NotImplementedError("scaled_dot_product_attention")


def _sdpa_half_only(q, k, v, mask=None):
    raise NotImplementedError("\"addmm_impl_cpu_\" not implemented for 'Half'")  # torch's own, not the stub


def _sdpa_detached(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).detach()
    return attention(q, k, v, mask, scale=1.0, scores=scores)


@torch.no_grad()
def _sdpa_no_grad(q, k, v, mask=None):
    return attention(q, k, v, mask)


def _sdpa_numpy(q, k, v, mask=None):
    scores = attention(q, k, v, mask, norm="scores")[1]  # masked
    e = np.exp(scores.numpy() - scores.numpy().max(-1, keepdims=True))
    weights = torch.from_numpy(e / e.sum(-1, keepdims=True))
    return weights @ v, weights


def _sdpa_numpy_detached(q, k, v, mask=None):
    weights = torch.from_numpy(attention(q, k, v, mask, norm="scores")[1].detach().numpy()).softmax(-1)
    return weights @ v, weights


def _sdpa_data(q, k, v, mask=None):
    return attention(q.data, k, v, mask)


def _sdpa_einsum(q, k, v, mask=None):
    q = q / q.shape[-1] ** 0.5  # pre-scaled queries
    scores = torch.einsum("...id,...jd->...ij", q, k)
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...ij,...jd->...id", weights, v), weights


SDPA = "scaled_dot_product_attention"
SLIPS = [Slip(SDPA, name, rule, hint, impl) for name, rule, hint, impl in [
    ("no_scale", "output", NO_SCALE, _sdpa(scale=1.0)),
    ("by_d", "output", "the scores look divided by d instead of sqrt(d)", _sdpa(scale=lambda q, k, v: 1 / q.shape[-1])),
    ("times", "output", TIMES, _sdpa(scale=lambda q, k, v: math.sqrt(q.shape[-1]))),
    ("by_dv", "output", BY_DV, _sdpa(scale=lambda q, k, v: 1 / math.sqrt(v.shape[-1]))),
    ("by_keys", "output", BY_DV, _sdpa(scale=lambda q, k, v: 1 / math.sqrt(k.shape[-2]))),
    ("by_tokens", "output", BY_DV, _sdpa(scale=lambda q, k, v: 1 / math.sqrt(q.shape[-2]))),
    ("after_softmax", "output", AFTER_SOFTMAX, _sdpa(scale=1.0, late_scale=lambda q, k, v: 1 / math.sqrt(q.shape[-1]))),
    ("axis", "output", WRONG_AXIS, _sdpa(axis=-2)),
    ("log_softmax", "output", LOG, _sdpa(norm="log")),
    ("sum", "output", "the scores are divided by their sum: the weights are their softmax, exp(scores) normalised, "
     "`scores.softmax(dim=-1)`", _sdpa(norm="sum")),
    ("scores_out", "output", SCORES_OUT, _sdpa(out_from="scores")),
    ("swapped", "output", PRODUCT, _sdpa(swap=True)),
    ("weights_first", "output", WEIGHTS_FIRST, lambda q, k, v, mask=None: attention(q, k, v, mask)[::-1]),
    ("out_only", "output", PAIR, lambda q, k, v, mask=None: attention(q, k, v, mask)[0]),
    ("double", "output", DOUBLE, lambda q, k, v, mask=None: tuple(t.double() for t in attention(q, k, v, mask))),
    ("nan", "output", NAN, lambda q, k, v, mask=None: tuple(t * float("nan") for t in attention(q, k, v, mask))),
    ("k.T", "output", known(r"\.T\b"), _sdpa(scores=lambda q, k, v: q @ k.T)),  # fine for 2-D k, wrong for a batch
    # fine for a 3-D batch, not for 2-D or 4-D inputs
    ("transpose_1_2", "output", known("Dimension out of range"), _sdpa(scores=lambda q, k, v: q @ k.transpose(1, 2))),
    ("bmm", "output", known("must be a 3D tensor"), _sdpa(scores=lambda q, k, v: torch.bmm(q, k.transpose(-2, -1)))),
    ("half_only", "output", known("not implemented for 'Half'"), _sdpa_half_only),
    ("mask_always", "output", known("bad operand type for unary ~: 'NoneType'"),
     lambda q, k, v, mask=None: attention(q, k, v, ~~mask)),
    ("fused", "plain", FUSED, lambda q, k, v, mask=None: (F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                                          attention(q, k, v, mask)[1])),
    ("no_mask_argument", "mask", MASK_ARGUMENT, lambda q, k, v: attention(q, k, v)),
    ("inverted", "mask", INVERTED, _sdpa(mask_mode="inverted")),
    ("ignored", "mask", IGNORED, _sdpa(mask_mode="none")),
    ("zero", "mask", ZEROED, _sdpa(mask_mode="zero")),
    ("after", "mask", AFTER, _sdpa(mask_mode="after")),
    ("added", "mask", "the boolean mask was added to the scores (True counts as 1): fill the scores where the mask "
     "is False with -inf instead", _sdpa(mask_mode="added")),
    ("detach", "gradient", CUT_AT, _sdpa_detached),
    ("no_grad", "gradient", CUT_AT, _sdpa_no_grad),
    ("numpy", "gradient", known("Can't call numpy() on Tensor that requires grad"), _sdpa_numpy),
    ("numpy_detached", "gradient", CUT_AT, _sdpa_numpy_detached),
    ("data", "gradient", CUT_AT, _sdpa_data),
    ("in_place", "inputs", IN_PLACE, _sdpa_in_place),
]] + [Slip(SDPA, "stub", None, "not done yet", _sdpa_stub)]


class _SelfAttention(nn.Module):
    """SelfAttention with one slip, ``slip`` (None: the statement's), the layers giving queries, keys and values
    (``roles``), the function computing the attention (``attend``) and its knobs ``knobs`` (a knob given as a function
    of x is computed from it)."""

    slip, roles, attend, knobs = None, "qkv", staticmethod(attention), {}

    def __init__(self, dim, head_dim):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, head_dim, bias=self.slip == "bias") for _ in range(3))
        if self.slip == "missing":  # the former API, without attention_weights
            self.attention_weights = None

    def _qkv(self, x):
        made = dict(q=self.q(x), k=self.k(x), v=self.v(x), x=x)  # x: attention on x itself, not projected
        q, k, v = (made[role] for role in self.roles)
        return {"q_detached": (q.detach(), k, v), "v_weight_data": (q, k, F.linear(x, self.v.weight.data))}.get(
            self.slip, (q, k, v))

    def forward(self, x, mask=None):
        if self.slip == "in_place":
            x /= math.sqrt(x.shape[-1])
        q, k, v = self._qkv(x)
        mask = None if self.slip == "mask_dropped" else mask
        if self.slip == "no_grad":
            with torch.no_grad():
                return attention(q, k, v, mask)[0]
        kw = {key: value(x) if callable(value) else value for key, value in self.knobs.items()}
        return attention(q, k, v, mask) if self.slip == "pair" else self.attend(q, k, v, mask, **kw)[0]

    def attention_weights(self, x, mask=None):
        if self.slip == "output_returned":
            return self(x, mask)
        return self.attend(*self._qkv(x), None if self.slip == "weights_no_mask" else mask)[1]


def _self_attention(slip=None, roles="qkv", attend=attention, **knobs):
    return type("SelfAttention", (_SelfAttention,), {"slip": slip, "roles": roles, "attend": staticmethod(attend),
                                                     "knobs": knobs})


def _roles(roles):
    """The hint for the projections used in the wrong ``roles`` (the layers giving queries, keys and values)."""
    wrong = [f"{what} from self.{used}" for what, used, right in zip(("queries", "keys", "values"), roles, "qkv",
                                                                      strict=True) if used != right]
    return QK_SWAPPED if roles == "kqv" else f"{ROLES} ({', '.join(wrong)}): {ROLES_FIX}"


SLIPS += [Slip("SelfAttention", name, rule, hint, _self_attention(name) if impl is None else impl)
          for name, rule, hint, impl in [
    ("linear", "names", NAMES, nn.Linear),
    ("no_scale", "output", NO_SCALE, _self_attention(scale=1.0)),
    ("axis", "output", WRONG_AXIS, _self_attention(axis=-2)),
    ("inverted", "mask", INVERTED, _self_attention(mask_mode="inverted")),
    ("bias", "names", NO_BIAS, None),
    ("by_dim", "output", BY_DIM, _self_attention(scale=lambda x: 1 / math.sqrt(x.shape[-1]))),
    ("unprojected", "output", "this is attention on x itself: project x with self.q, self.k and self.v first",
     _self_attention(roles="xxx")),
    ("pair", "output", TUPLE, None),
    ("mask_dropped", "mask", NOT_PASSED, None),
    ("missing", "attention_weights", WEIGHTS_REQUIRED, None),
    ("output_returned", "attention_weights", WEIGHTS_NOT_OUTPUT, None),
    ("weights_no_mask", "attention_weights", WEIGHTS_MASK, None),
    ("q_detached", "gradient", CUT_AT, None),
    ("v_weight_data", "gradient", CUT_AT, None),
    ("no_grad", "gradient", CUT_AT, None),
    ("in_place", "inputs", IN_PLACE, None),
]] + [Slip("SelfAttention", {"qkk": "values_from_k", "qvk": "roles", "kqv": "qk_swapped"}.get(roles, f"roles_{roles}"),
           "output", _roles(roles), _self_attention(roles=roles))
      for roles in map("".join, itertools.product("qkv", repeat=3)) if roles != "qkv"]  # three keep their first names


VARIANTS = [Variant(SDPA, "reference", ref.scaled_dot_product_attention), Variant(SDPA, "einsum", _sdpa_einsum),
            Variant(SDPA, "knobs", _sdpa()), Variant("SelfAttention", "reference", ref.SelfAttention),
            Variant("SelfAttention", "sdpa", _self_attention(attend=_sdpa_einsum)),  # the einsum attention
            Variant("SelfAttention", "knobs", _self_attention(None))]
