"""How the checks show learner values and errors (all chapters): one-line descriptions, in-place snapshots,
the line of learner code that raised, and the hints for errors PyTorch raises in learner code."""

import inspect
import os
import re
import traceback
import types

import torch
from torch import nn

ERROR_HINTS = (  # (text in the error message, likely cause)
    ("division by zero", "a division by a number that is 0 here, e.g. depth - 1 with depth=1: guard it as the "
                         "statement does, max(depth - 1, 1)"),
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
    ("Can't call numpy() on Tensor that requires grad",
     "a detour through numpy: numpy has no gradients, so nothing before it would ever learn; stay with torch "
     "operations (every numpy function you need has a torch twin)"),
    ("bad operand type for unary ~: 'NoneType'",
     "the mask is optional: apply it only `if mask is not None`"),
    ("cannot unpack non-iterable int object",
     "a size given as one int (a square) was unpacked as a pair: turn it into a pair first, "
     "`to_pair(size)` gives (size, size) for an int and leaves a pair alone"),
    ("not supported between instances of 'tuple' and 'int'",
     "a pair where one int is expected: patch_size is a single int P (patches are square)"),
    ("Dimension out of range", "an axis number the tensor does not have: the check also tries inputs with fewer "
                               "leading axes than a batch, so count the axes from the end (`-1`, `-2`), e.g. "
                               "`k.transpose(-2, -1)`"),
    ("must be a 3D tensor", "torch.bmm takes 3-D batches only; `@` (torch.matmul) multiplies matrices with any "
                            "number of leading axes, none included"),
    ("Could not infer sizes for", "einops splits an axis in two only when it is given all but one of the sizes: "
                                  "pass the grid's rows, e.g. `h=grid_h` (the grid need not be square)"),
)
LINE_HINTS = (  # (regex on the learner's line that raised, likely cause): checked before ERROR_HINTS
    (r"\.T\b", "`.T` reverses all the axes of a tensor with more than two: to swap the last two axes of a batch "
               "of matrices use `k.transpose(-2, -1)` (or `k.mT`)"),
)


def known(key):
    """The likely cause ERROR_HINTS or LINE_HINTS give for ``key`` (the text or regex they key it on)."""
    return dict(ERROR_HINTS + LINE_HINTS)[key]


SHORT = 40  # characters of a plain repr before it is cut
_HERE = os.path.dirname(os.path.abspath(__file__))
_COURSE = os.path.dirname(_HERE)  # vit_course/: the course's own code, never the learner's
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


def _learner(frame):
    """True for a frame of learner code: not torch, not an installed package, not the course's own vit_course."""
    records = os.path.join(_HERE, "ch")  # the records' slips stand for a learner's code
    return (frame.filename.startswith(records) or not frame.filename.startswith((_COURSE, _TORCH))) and (
        "site-packages" not in frame.filename)


def where(error):
    """'\n  at line N of your code: code' for the innermost frame of learner code, saying so when the error came
    from inside the course's own functions that this line called; or ''."""
    stack = traceback.extract_tb(error.__traceback__)
    mine = [i for i, f in enumerate(stack) if _learner(f)]
    if not mine:
        return ""
    frame = stack[mine[-1]]
    text = f"\n  at line {frame.lineno} of your code" + (f": {frame.line.strip()}" if frame.line else "")
    course = [f for f in stack[mine[-1] + 1:] if f.filename.startswith(_COURSE) and not f.filename.startswith(_HERE)]
    if course:
        text += f"\n  (the error comes from the course's `{course[-1].name}`, called there with your values)"
    return text


def error_hint(error, hints=()):
    """The likely cause of an exception raised in learner code: the hints keyed on the line that raised first, then
    ``hints`` ((text, hint) pairs for this call), then the generic ones; or None."""
    message = str(error)
    mine = [f for f in traceback.extract_tb(error.__traceback__) if _learner(f)]
    line = (mine[-1].line or "").split("#")[0] if mine else ""
    return next((h for pattern, h in LINE_HINTS if re.search(pattern, line)), None) or next(
        (h for text, h in list(hints) + list(ERROR_HINTS) if text in message), None)


def mentions(text, shape):
    """True if ``text`` names ``shape`` in any usual spelling: (1, 6, 6), [1, 6, 6], torch.Size([1, 6, 6]), 1x6x6."""
    numbers = [str(int(n)) for n in shape]
    pattern = r"(?<![\d.])(?<!\d,)(?<!\d, )" + r"\s*[,x×]\s*".join(numbers) + r"(?![\d.])(?!\s*[,x×]\s*\d)"
    return bool(re.search(pattern, text))
