"""Helpers the checks of chapters 01-05 share: attention with the usual mistakes and their hints, random
masks, randomised LayerNorms, signature probing, the dropout probe (eval mode off, training mode on), and
a float16 call (chapters 08-09 too)."""

import inspect
import math

import torch
from torch.overrides import TorchFunctionMode

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
QK_SWAPPED = "queries and keys look swapped: scores are q k^T, one row per query"
NO_TRANSPOSE = ("your heads look reshaped without a transpose: `.view(b, h, n, d)` mixes tokens and heads; "
                "reshape to (b, n, h, d) first, then transpose tokens and heads")
INTERLEAVED = ("your heads take every h-th feature: head i should own the i-th contiguous block of d features, "
               "the pattern 'b n (h d) -> b h n d'")


class TorchCalls(TorchFunctionMode):
    """Inside it, counts the torch functions and tensor methods called (a loop over samples calls them per sample)
    and keeps their names (``names``): what learner code used, whatever it imported."""

    def __init__(self):
        super().__init__()
        self.count, self.names = 0, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def attention(q, k, v, mask=None, scale=None, axis=-1, mask_mode="ok", late_scale=None):
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
    weights = scores.softmax(axis) * (1.0 if late_scale is None else late_scale)
    if mask is not None and mask_mode == "after":
        weights = weights * mask
    return weights @ v, weights


def attention_hints(q, k, v, mask=None, which=0):
    """(hint, thunk) pairs: the outputs (which=0) or weights (which=1) of the usual attention mistakes."""
    d, root = q.shape[-1], math.sqrt(q.shape[-1])
    variants = [(NO_SCALE, dict(scale=1.0)), (BY_D, dict(scale=1 / d)), (TIMES, dict(scale=root)),
                (BY_DV, dict(scale=1 / math.sqrt(v.shape[-1]))), (BY_DV, dict(scale=1 / math.sqrt(k.shape[-2]))),
                (BY_DV, dict(scale=1 / math.sqrt(q.shape[-2]))), (AFTER_SOFTMAX, dict(scale=1.0, late_scale=1 / root)),
                (WRONG_AXIS, dict(axis=-2))]
    if mask is not None:
        variants += [(INVERTED, dict(mask_mode="inverted")), (IGNORED, dict(mask_mode="none")),
                     (ZEROED, dict(mask_mode="zero")), (AFTER, dict(mask_mode="after")),
                     (ADDED, dict(mask_mode="added"))]
    hints = [(h, lambda kw=kw: attention(q, k, v, mask, **kw)[which]) for h, kw in variants]
    hints.append((QK_SWAPPED, lambda: attention(k, q, v, None if mask is None else mask.transpose(-2, -1))[which]))
    return hints


def reference(name):
    """The course's reference ``name`` from the package's top level, looked up when a check runs (so the checks
    need not know which module holds it, and ``vit_course`` can import ``checks`` first)."""
    import vit_course

    return getattr(vit_course, name)


def accepts(fn, name):
    """True if ``fn`` takes a keyword argument ``name`` (or **kwargs, or its signature is unknown)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def random_mask(shape, generator, p=0.5):
    """A random boolean mask (True = may attend) in which every query may attend to at least key 0."""
    mask = torch.rand(shape, generator=generator) > p
    mask[..., 0] = True
    return mask


def randomize_norms(module, generator):
    """Give every LayerNorm a random scale and shift, so a shared or missing norm cannot pass."""
    with torch.no_grad():
        for sub in module.modules():
            if "LayerNorm" in type(sub).__name__ and getattr(sub, "weight", None) is not None:
                sub.weight.copy_(torch.rand(sub.weight.shape, generator=generator) + 0.5)
                sub.bias.copy_(torch.randn(sub.bias.shape, generator=generator) * 0.5)
    return module


def only_biases(missing, extra):
    """For ``Checker.load`` hints: every missing or unexpected parameter is a bias."""
    return all(k.endswith("bias") for k in missing + extra)


def check_dropout(c, model, x, expected, what, eval_hint, train_hint, label, atol=1e-5):
    """``model`` built with a dropout rate: in eval mode it must be deterministic and equal ``expected``
    (dropout off); in training mode two calls must differ (dropout on). Leaves the model in eval mode."""
    with torch.no_grad():
        model.eval()
        first = c.tensor(c.call(model, x, label=f"{label} in eval mode"), f"output in eval mode ({what})",
                         expected.shape, expected.dtype)
        second = c.call(model, x, label=f"{label} in eval mode")
        c.ok(torch.equal(first, second), f"{what}, in eval mode two calls on the same input gave different "
             "outputs: the dropout is still on", eval_hint)
        c.close(first, expected, f"output in eval mode ({what})", atol=atol)
        model.train()
        try:
            first, second = c.call(model, x, label=f"{label} in training mode"), c.call(
                model, x, label=f"{label} in training mode")
        finally:
            model.eval()
        c.ok(not torch.allclose(first, second), f"{what}, in training mode two calls on the same input gave the "
             "same output: the dropout is off", train_hint)


def check_attention_weights(c, model, x, weights, label, mask=None, masked=None, shape_hints=(), required=None):
    """The ``attention_weights(x, mask=None)`` method: the reference's weights, no dropout. ``required``: what the
    statement asks for (the check fails without the method); None: optional."""
    method = getattr(model, "attention_weights", None)
    if not callable(method):
        if required:
            c.fail(f"{type(model).__name__} has no method attention_weights", f"write {required}, as the exercise "
                   "asks: the chapters after this one draw the weights with it")
        return
    got = c.call(method, x, label=f"{label}.attention_weights")
    c.close(got, weights, "weights from attention_weights", shape_hints=shape_hints)
    if mask is not None and accepts(method, "mask"):
        got = c.call(method, x, mask=mask, label=f"{label}.attention_weights")
        c.close(got, masked, "weights from attention_weights with a mask",
                [("the mask seems not to reach the weights: pass it on to the attention", lambda: weights)])


def call_half(c, fn, shape, generator, *args, expect, problem, hint):
    """Call ``fn`` on a random float16 table of ``shape`` (then ``args``); fail with ``problem`` (which may name
    ``{dtype}``) and ``hint`` unless the result's dtype is ``expect``. -> (the table, the result)."""
    table = torch.randn(*shape, generator=generator).half()
    got = c.call(fn, table, *args)
    if torch.is_tensor(got) and got.dtype != expect:
        c.fail(problem.format(dtype=got.dtype), hint)
    return table, got
