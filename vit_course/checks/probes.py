"""What the checks learn about learner code besides its output (chapters 01-09): the torch functions it calls, its
result on float16 input, and why it raised (``call_naming``, with ``works_on`` as a cause finder)."""

import torch
from torch.overrides import TorchFunctionMode

from .core import CheckFailed, is_stub


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


def call_half(c, fn, shape, generator, *args, expect, problem, hint):
    """Call ``fn`` on a random float16 table of ``shape`` (then ``args``); fail with ``problem`` (which may name
    ``{dtype}``) and ``hint`` unless the result's dtype is ``expect``. -> (the table, the result)."""
    table = torch.randn(*shape, generator=generator).half()
    got = c.call(fn, table, *args)
    if torch.is_tensor(got) and got.dtype != expect:
        c.fail(problem.format(dtype=got.dtype), hint)
    return table, got


def call_naming(c, fn, *args, cause):
    """``c.call(fn, *args)``; when the learner's code raises, ``cause()`` may name why (a hint, or None), and that
    hint replaces the generic one."""
    try:
        return c.call(fn, *args)
    except CheckFailed as failure:
        error = failure.__context__  # what the learner's code raised, if it raised
        if error is None or isinstance(error, CheckFailed) or (isinstance(error, NotImplementedError)
                                                               and is_stub(error)):
            raise
        hint = cause()
        if hint is None:
            raise
        c.fail(str(failure).removeprefix(f"{c.name}: ").split("\n  likely cause:")[0], hint)


def works_on(fn, *args):
    """A cause finder for ``call_naming``: True when ``fn(*args)`` runs without an error."""
    try:
        fn(*args)
    except Exception:
        return False
    return True
