"""Chapter 01's exercises: scaled_dot_product_attention and SelfAttention, their checks, rules and
the usual attention slips (their hints and attention computed with each, so a check can name the slip whose output
the learner's matches; chapters 02-03 reuse them)."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import itertools
import math

import torch
import torch.nn.functional as F

from .. import attention as ref
from .core import check
from .gradients import gradient_flow
from .modules import check_attention_weights, only_biases
from .probes import TorchCalls

NO_SCALE = "this is the output without the 1/sqrt(d) scaling: divide the scores q k^T by sqrt(d), d = q's last size"
BY_D = "the scores look divided by d instead of sqrt(d)"
TIMES = "the scores look multiplied by sqrt(d): divide them by sqrt(d), d = q's last size"
BY_DV = ("the scores are scaled with the wrong size (the values' width or a number of tokens): the scale is "
         "1/sqrt(d), d = q's last size")
AFTER_SOFTMAX = "the 1/sqrt(d) scaling is applied after the softmax: scale the scores before it"
WRONG_AXIS = "softmax over the wrong axis: each query's weights must sum to 1 over the keys, the last axis (dim=-1)"
INVERTED = "the mask looks inverted: True means 'may attend', so fill the scores where the mask is False"
IGNORED = "the mask seems to be ignored: set the scores where the mask is False to -inf before the softmax"
ZEROED = "masked scores were set to 0 instead of -inf: exp(0) = 1 still gives them weight"
AFTER = "the mask was applied after the softmax: mask the scores before it, so the rows still sum to 1"
ADDED = ("the boolean mask was added to the scores (True counts as 1): fill the scores where the mask is False "
         "with -inf instead")
LOG = "these are log-probabilities (log_softmax): the weights are the softmax of the scores, each row summing to 1"
SUM = ("the scores are divided by their sum: the weights are their softmax, exp(scores) normalised, "
       "`scores.softmax(dim=-1)`")
SCORES_OUT = "the output multiplies the scores by v: multiply the weights (after the softmax), `weights @ v`"
QK_SWAPPED = "queries and keys look swapped: scores are q k^T, one row per query"
NO_TRANSPOSE = ("your heads look reshaped without a transpose: `.view(b, h, n, d)` mixes tokens and heads; "
                "reshape to (b, n, h, d) first, then transpose tokens and heads")
INTERLEAVED = ("your heads take every h-th feature: head i should own the i-th contiguous block of d features, "
               "the pattern 'b n (h d) -> b h n d'")


def attention(q, k, v, mask=None, scale=None, axis=-1, mask_mode="ok", late_scale=None, norm="softmax",
              out_from="weights"):
    """Reference attention with the knobs learners get wrong (for diagnosis only): (out, weights)."""
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and mask_mode == "ok":
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask, float("-inf"))
    elif mask is not None and mask_mode == "zero":
        scores = scores.masked_fill(~mask, 0.0)
    elif mask is not None and mask_mode == "added":
        scores = scores + mask
    weights = {"softmax": scores.softmax, "log": scores.log_softmax, "sum": lambda a: scores / scores.sum(
        a, keepdim=True)}[norm](axis) * (1.0 if late_scale is None else late_scale)
    if mask is not None and mask_mode == "after":
        weights = weights * mask
    return (scores if out_from == "scores" else weights) @ v, weights


def attention_hints(q, k, v, mask=None, which=0):
    """(hint, thunk) pairs: the outputs (which=0) or weights (which=1) of the usual attention mistakes."""
    d, root = q.shape[-1], math.sqrt(q.shape[-1])
    variants = [(NO_SCALE, dict(scale=1.0)), (BY_D, dict(scale=1 / d)), (TIMES, dict(scale=root)),
                (BY_DV, dict(scale=1 / math.sqrt(v.shape[-1]))), (BY_DV, dict(scale=1 / math.sqrt(k.shape[-2]))),
                (BY_DV, dict(scale=1 / math.sqrt(q.shape[-2]))), (AFTER_SOFTMAX, dict(scale=1.0, late_scale=1 / root)),
                (WRONG_AXIS, dict(axis=-2)), (LOG, dict(norm="log")), (SUM, dict(norm="sum")),
                (SCORES_OUT, dict(out_from="scores"))]
    if mask is not None:
        variants += [(INVERTED, dict(mask_mode="inverted")), (IGNORED, dict(mask_mode="none")),
                     (ZEROED, dict(mask_mode="zero")), (AFTER, dict(mask_mode="after")),
                     (ADDED, dict(mask_mode="added"))]
    hints = [(h, lambda kw=kw: attention(q, k, v, mask, **kw)[which]) for h, kw in variants]
    hints.append((QK_SWAPPED, lambda: attention(k, q, v, None if mask is None else mask.transpose(-2, -1))[which]))
    return hints


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


def _pair(c, out):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = "None" if out is None else f"a {type(out).__name__}"
        c.fail(f"should return a pair (out, weights), got {got}", "return both: `return weights @ v, weights`")
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
             "F.scaled_dot_product_attention", "write the steps with plain tensor operations (@, .transpose, "
             ".softmax, .masked_fill), as the exercise asks: the check compares yours against the fused function")
        c.phase("output" if mask_shape is None else "mask")
        got_out, got_weights = _pair(c, out)
        swapped = (tuple(expected_weights.shape), "you returned (weights, out): the output comes first")
        c.tensor(got_weights, "weights", expected_weights.shape, torch.float32,
                 [(expected_out.shape, "you returned (weights, out): the output comes first")])
        c.close(got_weights, expected_weights, "attention weights", attention_hints(q, k, v, mask, which=1))
        c.close(got_weights.sum(-1), torch.ones(expected_weights.shape[:-1]), "row sums of the weights")
        c.close(got_out, expected_out, "output", attention_hints(q, k, v, mask), shape_hints=[swapped])
        torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        c.close(got_out, torch_out, "output (against torch.nn.functional.scaled_dot_product_attention)")
        if mask_shape in (None, (5, 7)) and len(q_shape) == 3:  # gradients, without and with a mask
            masks = [mask][:mask is not None]  # no mask argument where the case has none
            gradient_flow(c, fn, lambda t, m=mask: _pair(c, c.call(fn, t["q"], t["k"], t["v"], *masks))[0],
                          lambda t, m=mask: ref.scaled_dot_product_attention(t["q"], t["k"], t["v"], m)[0],
                          dict(q=q, k=k, v=v))


def _roles(q, k, v, mask=None):
    """(hint, thunk) pairs: the projections used in the wrong roles (also twice, one of them left out)."""
    made = dict(q=q, k=k, v=v)
    hints = []
    for roles in itertools.product("qkv", repeat=3):
        if roles == ("q", "k", "v"):
            continue
        wrong = [f"{what} from self.{used}" for what, used, right in zip(("queries", "keys", "values"), roles, "qkv",
                                                                          strict=True) if used != right]
        hint = QK_SWAPPED if roles == ("k", "q", "v") else (
            f"the layers play the wrong roles ({', '.join(wrong)}): queries come from self.q(x), keys from "
            "self.k(x), values from self.v(x)")
        hints.append((hint, lambda r=roles: attention(made[r[0]], made[r[1]], made[r[2]], mask)[0]))
    return hints


@check("SelfAttention")
def SelfAttention(c, cls):
    """SelfAttention(dim, head_dim): bias-free Linear layers q, k, v; forward(x, mask=None) -> (b, m, head_dim);
    attention_weights(x, mask=None) -> (b, m, m); gradients reach x and the three layers."""
    g = torch.Generator().manual_seed(2)
    for dim, head_dim, batch, n in ((10, 6, 2, 7), (4, 9, 3, 1), (16, 8, 1, 5)):
        reference = ref.SelfAttention(dim, head_dim).eval()
        model = c.build(cls, dim, head_dim)
        c.load(model, reference, [
            (only_biases, "the q, k and v layers have no bias: nn.Linear(dim, head_dim, bias=False)"),
            ("", "name the three layers q, k and v")])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"SelfAttention({dim}, {head_dim})"
        with torch.no_grad():
            q, k, v = reference.q(x), reference.k(x), reference.v(x)
            expected, weights = ref.scaled_dot_product_attention(q, k, v)
            c.close(c.call(model, x, label=label), expected, "output", attention_hints(q, k, v) + [
                ("the scores are scaled by 1/sqrt(dim): use the width of the queries, 1/sqrt(head_dim)",
                 lambda: attention(q, k, v, scale=1 / math.sqrt(dim))[0]),
                ("this is attention on x itself: project x with self.q, self.k and self.v first",
                 lambda: attention(x, x, x)[0])] + _roles(q, k, v))
            c.phase("mask")
            mask = random_mask((n, n), g)
            masked_out, masked_weights = ref.scaled_dot_product_attention(q, k, v, mask)
            got = c.call(model, x, mask=mask, label=label)
            c.close(got, masked_out, "output with a mask", [(NOT_PASSED, lambda: expected)] + attention_hints(
                q, k, v, mask) + _roles(q, k, v, mask))
            c.phase("attention_weights")
            check_attention_weights(c, model, x, weights, label, mask, masked_weights,
                                    [((batch, n, head_dim), "this is the output: return the (b, m, m) weights")],
                                    required="attention_weights(x, mask=None) returning the (b, m, m) weights")
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label),
                      lambda t: reference(t["x"]), dict(x=x), model, reference)


# each exercise's rules: the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule)
# and the words that state it in the exercise's statement
RULES = {
    "scaled_dot_product_attention": {
        "output": "returning `(out, weights)`",
        "plain": "Use plain tensor operations (`@`, `.transpose`, `.softmax`, `.masked_fill`), not PyTorch's fused "
                 "function",
        "mask": "True = may attend",
        "gradient": "gradients flow back to `q`, `k` and `v`",
    },
    "SelfAttention": {
        "names": "three bias-free linear layers named `q`, `k` and `v`",
        "output": "returns the output `(b, m, head_dim)`",
        "mask": "passing `mask` on to the attention",
        "attention_weights": "`attention_weights(x, mask=None)` returns the weights `(b, m, m)`",
        "gradient": "gradients flow back to `x` and to the weights of `q`, `k` and `v`",
    },
}
