"""Where a module's dropouts are (chapters 02-05): in training mode, inside ``TracedDropout``, every dropout is
deterministic, so the learner's module and the reference give the same output when, and only when, the same
dropouts sit in the same places with the same probabilities; ``dropout_wiring`` compares both and names what
differs."""

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

DROPOUTS = {F.dropout, torch.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d}


class TracedDropout(TorchFunctionMode):
    """Inside it, a dropout of probability p in training mode multiplies its input by 1 + p instead of zeroing a
    random part (the fused attention's ``dropout_p`` scales the attention weights the same way); ``calls`` lists
    ``(p, shape)`` of each one applied."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in DROPOUTS:
            x, p, training = _dropout_args(func, args, kwargs)
            if not training or p == 0:
                return x
            self.calls.append((round(float(p), 6), tuple(x.shape)))
            return x * (1 + p)
        if func is F.scaled_dot_product_attention and _dropout_p(args, kwargs):
            return self._attention(*args, **kwargs)
        return func(*args, **kwargs)

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
        scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
        if is_causal:
            n, m = scores.shape[-2:]
            attn_mask = torch.ones(n, m, dtype=torch.bool).tril()
        if attn_mask is not None:
            scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                      else scores + attn_mask)
        weights = scores.softmax(-1)  # (..., n, m)
        self.calls.append((round(float(dropout_p), 6), tuple(weights.shape)))
        return weights * (1 + dropout_p) @ v


def _dropout_args(func, args, kwargs):
    """(input, p, training) of a call to one of ``DROPOUTS`` (torch.dropout's third argument is ``train``)."""
    names = ("input", "p", "train" if func is torch.dropout else "training")
    values = dict(zip(names, args, strict=False)) | kwargs
    return values["input"], values.get("p", 0.5), values.get("train", values.get("training", True))


def _dropout_p(args, kwargs):
    return kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)


def traced(module, x, **kwargs):
    """``module(x)`` in training mode with deterministic dropouts -> (output, the dropouts applied)."""
    module.train()
    try:
        with TracedDropout() as trace, torch.no_grad():
            out = module(x, **kwargs)
    finally:
        module.eval()
    return out, trace.calls


def dropout_wiring(c, model, reference, x, label, places, hint):
    """In training mode, ``model`` must apply the reference's dropouts (probability and shape) and, made
    deterministic, give its output. ``places``: {(p, shape): what the statement calls that dropout}; ``hint``: how
    to wire them. One test."""
    expected, trace = traced(reference, x)
    c._try(model, (x,), {}, f"{label} in training mode")
    try:
        got, calls = traced(model, x)
    except Exception as error:
        c._raised(error)
    missing, extra = Counter(trace) - Counter(calls), Counter(calls) - Counter(trace)
    if missing or extra:
        said = [f"missing: {_listed(missing, places)}" if missing else "",
                f"not in the statement: {_listed(extra, {})}" if extra else ""]
        c.fail(f"in training mode your dropouts differ from the statement's; {'; '.join(s for s in said if s)}",
               hint)
    c.tensor(got, "output in training mode", expected.shape)
    if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
        c.fail("in training mode your dropouts have the right probabilities but sit in other places than the "
               "statement's (output compared with every dropout made deterministic)", hint)
    c.passed()


def _listed(calls, places):
    """'2 x drop=0.1 after fc2, p=0.3 on (2, 5, 5)' for a Counter of (p, shape), named by ``places`` where it can."""
    return ", ".join(f"{n} x " * (n > 1) + places.get(key, f"p={key[0]:g} on {key[1]}") for key, n in calls.items())
