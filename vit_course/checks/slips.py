"""The usual attention slips (chapters 01-05): their hints, attention computed with each of them (so a check can
name the slip whose output the learner's matches), and random masks to test attention on."""

import math

import torch

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
