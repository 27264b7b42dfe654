"""How the checks show learner values and errors (all chapters): one-line descriptions, in-place snapshots,
the line of learner code that raised, and the hints for errors PyTorch raises in learner code."""

import inspect
import os
import traceback
import types

import torch
from torch import nn

ERROR_HINTS = (  # (text in the error message, likely cause)
    ("view size is not compatible with input tensor's size and stride",
     "a transposed or permuted tensor is not contiguous in memory: use .reshape(...) instead of .view(...)"),
    ("has no len()", "the batches may come one at a time (a generator, a DataLoader): go through them once and "
                     "count the samples as you go, instead of calling len() on them"),
    ("not implemented for 'Half'", "this operation has no float16 version here: compute in float32 (`.float()`) "
                                   "and convert the result back (`.to(dtype)`)"),
    ("a leaf Variable that requires grad is being used in an in-place operation",
     "an in-place operation on a parameter: use the out-of-place form, or work on `.detach()`"),
    ("does not require grad and does not have a grad_fn",
     "the loss has no graph: compute it from the model's output, outside torch.no_grad(), and call "
     "backward() before .item()"),
)
SHORT = 40  # characters of a plain repr before it is cut
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def _short(text):
    text = " ".join(str(text).split())  # one line
    return text if len(text) <= SHORT else text[:SHORT - 3] + "..."


def _tensor(x):
    kind = "bool " if x.dtype == torch.bool else "" if x.dtype == torch.float32 else f"{x.dtype} ".replace("torch.", "")
    return f"{kind}tensor{tuple(x.shape)}"


def _optimizer(x):
    group = x.param_groups[0] if x.param_groups else {}
    shown = [f"{k}={group[k]:g}" if isinstance(group[k], float) else f"{k}={group[k]}"
             for k in ("lr", "momentum", "betas", "weight_decay") if group.get(k)]
    return f"{type(x).__name__}({', '.join(shown)})"


def _module(x):
    extra = x.extra_repr()
    if extra and "\n" not in extra and len(extra) <= 2 * SHORT:
        return f"{type(x).__name__}({extra})"
    return type(x).__name__


def _sequence(x):
    if len(x) <= 4:
        inner = ", ".join(describe(t) for t in x)
        inner = inner + "," if isinstance(x, tuple) and len(x) == 1 else inner
        text = f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
        if len(text) <= 2 * SHORT:
            return text
    if x and all(torch.is_tensor(t) for t in x):
        shapes = {tuple(t.shape) for t in x}
        shape = f" {shapes.pop()}" if len(shapes) == 1 else ""
        return f"{type(x).__name__} of {len(x)} tensors{shape}"
    return f"{type(x).__name__} of {len(x)}"


def describe(x):
    """A short one-line description of any value for messages: tensors by dtype and shape, optimizers and
    modules by class and settings, sequences element by element, functions by name, the rest by a cut repr."""
    if torch.is_tensor(x):
        return _tensor(x)
    if isinstance(x, torch.optim.Optimizer):
        return _optimizer(x)
    if isinstance(x, nn.Module):
        return _module(x)
    if isinstance(x, (list, tuple)):
        return _sequence(x)
    if isinstance(x, torch.Generator):
        return "torch.Generator"
    if isinstance(x, types.GeneratorType):
        return "a generator"
    if isinstance(x, type):
        return f"class {x.__name__}"
    if isinstance(x, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return f"function {x.__name__}"
    if isinstance(x, dict):
        return _short(repr(x)) if len(repr(x)) <= SHORT else f"dict of {len(x)} items"
    return _short(repr(x))


def snapshot(x):
    """A copy of a tensor (or of the tensors in a list) to tell later whether learner code changed it."""
    if torch.is_tensor(x):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return [snapshot(t) for t in x]
    return None


def changed(before, after):
    if torch.is_tensor(after):
        return before is not None and (before.shape != after.shape or not torch.equal(before, after.detach()))
    if isinstance(after, (list, tuple)) and isinstance(before, list):
        return len(before) != len(after) or any(changed(b, a) for b, a in zip(before, after, strict=False))
    return False


def argument_names(fn, args, kwargs):
    """The parameter names the arguments bind to (for "changed its input `q`"), or "argument N"."""
    try:
        fn = fn.forward if isinstance(fn, nn.Module) else fn  # a module's call signature is (*args, **kwargs)
        return list(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return [f"argument {i + 1}" for i in range(len(args))] + list(kwargs)


def where(error):
    """'\n  at line N: code' for the innermost frame of learner code (not torch, not the checks), or ''."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith((_HERE, _TORCH)) and "site-packages" not in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f"\n  at line {frame.lineno}: {frame.line.strip()}" if frame.line else f"\n  at line {frame.lineno}"
