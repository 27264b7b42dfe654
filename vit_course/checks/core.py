"""The machinery every check shares (all chapters): ``CheckFailed``, running learner code safely, comparing outputs.

A check is a function decorated with ``@check("name")`` whose body gets a ``Checker`` and the
learner's function or class. Everything the learner wrote runs through ``Checker.call``, so an
exception, a wrong type, a NaN or a changed input becomes a ``CheckFailed`` that says what was
tried, what was expected and, when the output matches a known mistake, the likely cause.
"""

import functools
import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

from .messages import argument_names, changed, describe, error_hint, mentions, snapshot, where

IN_PLACE = ("an in-place operation on an input (`x += ...`, `x /= ...`, `masked_fill_`, `x[...] = ...`): use the "
            "out-of-place form (`x = x + ...`, `masked_fill`) or work on a copy")
NAME_VALUES = "put the values involved in the message, e.g. with an f-string"
PLAIN_NUMBER = "return a plain number: `.item()` turns a one-element tensor into one"
TUPLE = ("return the one tensor asked for, not a tuple: a forward returns its output alone (the attention weights "
         "have their own method), e.g. `out, weights = ...` then `return out`")
DOUBLE = ("a float64 result: numpy arrays, `torch.tensor` of Python floats and `.double()` are float64; compute with "
          "torch operations on the inputs (or convert back, `.to(x.dtype)`)")
NAN = "a division by zero, a sqrt or log of a negative number, or a row whose every score is -inf (fully masked)"
COURSE_RULES = ("inputs",)  # every check: learner code leaves its inputs unchanged (chapter 01 states it)


@dataclass(frozen=True)
class Slip:
    """A learner's mistake, written once in its exercise's record: ``impl`` a wrong implementation (called like the
    learner's), ``rule`` the exercise's rule it breaks and ``hint`` the likely cause its check names. The check names
    it by running ``impl`` on the input the learner's code failed (``Checker.named``); the tests feed ``impl`` to the
    check and ask for ``rule`` and ``hint``."""

    exercise: str
    name: str
    rule: str
    hint: str
    impl: object

    def __post_init__(self):
        NAMING.setdefault(id(self.hint), []).append(self)
        CATALOGUE.setdefault(self.exercise, []).append(self)


NAMING = {}  # id of a hint object -> the slips holding that very object (a check that passes it names them)
CATALOGUE = {}  # exercise -> its slips, in their records' order (Checker.slips)


@dataclass(frozen=True)
class Variant:
    """A correct implementation the statement allows, written in its exercise's record: its check must pass it."""

    exercise: str
    name: str
    impl: object


class CheckFailed(AssertionError):
    """An exercise check found a problem; the message says what was tried, expected, and the likely cause.
    ``rule``: the key of the exercise's rule it broke (None for an exercise not done yet)."""

    rule = None
    slip = None  # the Slip of the record the check named as the likely cause, if it named one

    def _render_traceback_(self):
        # IPython (Jupyter, nbclient, nbval) calls this instead of printing a traceback: the learner
        # sees the message alone. Plain Python ignores it and prints the usual traceback.
        return [f"\x1b[0;31mCheckFailed\x1b[0m: {self}"]


def is_stub(error):
    """True for the exercise stub's ``raise NotImplementedError("name")`` (or a bare one), not for torch's own
    NotImplementedError ("... not implemented for 'Half'"), which is a real error of the learner's code."""
    return not error.args or (isinstance(error.args[0], str) and (not error.args[0] or error.args[0].isidentifier()))


class Checker:
    """The state of one check run: its name, the call being tested, the rule of the exercise being tested
    (``phase``), which a failure carries as ``CheckFailed.rule``, and the rules a test has passed for."""

    def __init__(self, name):
        self.name, self.tried, self.rule, self.rules_seen = name, None, "output", set()

    def passed(self):
        """A test of the rule being tested passed (``rules_seen``: the checks' own tests read them)."""
        self.rules_seen.add(self.rule)

    def phase(self, rule):
        """From here on the checks test the exercise's rule ``rule`` (a key of its list of rules)."""
        self.rule = rule
        return self

    def fail(self, message, hint=None, rule=None):
        """Raise CheckFailed; ``hint``: the likely cause, a text or a ``Slip`` of the record (the failure carries it
        as ``CheckFailed.slip``)."""
        slip, hint = (hint, hint.hint) if isinstance(hint, Slip) else (next(
            (s for s in NAMING.get(id(hint), ()) if s.hint is hint and s.exercise == self.name), None), hint)
        text = f"{self.name}: {message}"
        if self.tried and "\n  tried:" not in text:
            text += f"\n  tried: {self.tried}"
        if hint:
            text += f"\n  likely cause: {hint}"
        error = CheckFailed(text)
        error.rule, error.slip = rule or self.rule, slip
        error.__suppress_context__ = True  # no "during handling of ..." noise
        raise error

    def ok(self, condition, message, hint=None):
        """One property test: fail with ``message`` (and ``hint``) unless ``condition``."""
        if not condition:
            self.fail(message, hint)
        self.passed()

    def _try(self, fn, args, kwargs, label):
        name = label or getattr(fn, "__name__", type(fn).__name__)
        name = self.name if name == "<lambda>" else name
        shown = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
        self.tried = f"{name}({', '.join(shown)})"

    def _raised(self, error, hints=()):
        """Turn an exception of learner code into CheckFailed: a stub is "not done yet", the rest says where."""
        if isinstance(error, NotImplementedError) and is_stub(error):
            raise not_done(self.name, error) from None
        message = f"your code raised {type(error).__name__}: {error}".rstrip(": ")
        self.fail(message + where(error), error_hint(error, hints))

    def call(self, fn, *args, label=None, errors=(), **kwargs):
        """Run learner code; exceptions, NotImplementedError and in-place changes become CheckFailed.

        ``errors``: (text in the error message, likely cause) pairs for what this call's mistakes raise."""
        self._try(fn, args, kwargs, label)
        names = argument_names(fn, args, kwargs)
        values = list(args) + list(kwargs.values())
        before = [snapshot(v) for v in values]
        if any(b is not None for b in before):
            self.rules_seen.add("inputs")
        try:
            out = fn(*args, **kwargs)
        except CheckFailed:
            raise
        except Exception as error:
            self._raised(error, errors)
        for arg, old, new in zip(names, before, values, strict=False):
            if changed(old, new):
                self.fail(f"your code changed its input `{arg}` in place; it must leave its inputs as they were",
                          IN_PLACE, "inputs")
        return out

    def raises(self, fn, *args, why, hint=None, label=None, names=(), shapes=(), rule=None, **kwargs):
        """Fail unless learner code raises a ValueError for input the exercise says to reject.

        ``why``: what is wrong with the input; ``rule``: the exercise's rule that says so. Only where the
        statement asks the message to name values: ``names``, values it must contain, and ``shapes``, shapes it
        must name in any usual spelling ((1, 6, 6), [1, 6, 6], torch.Size([1, 6, 6]), 1x6x6); an entry of
        ``shapes`` may be a list of alternatives.
        """
        if rule:
            self.phase(rule)
        self._try(fn, args, kwargs, label)
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError as error:
            if is_stub(error):
                raise not_done(self.name, error) from None
            self.fail(f"{why}: expected a ValueError, your code raised NotImplementedError: {error}", hint)
        except ValueError as error:
            text = str(error)
            missing = [str(v) for v in names if str(v) not in text] + [
                " or ".join(str(tuple(s)) for s in alternatives) for alternatives in
                ([s] if isinstance(s, tuple) else s for s in shapes)
                if not any(mentions(text, s) for s in alternatives)]
            self.ok(not missing, f"{why}: your ValueError says {text!r}, which does not name "
                    f"{' and '.join(missing)}", NAME_VALUES)
            return
        except Exception as error:
            first = str(error).strip().split("\n")[0]
            self.fail(f"{why}: expected a ValueError, your code raised {type(error).__name__}: {first}"
                      + where(error), hint or error_hint(error))
        self.fail(f"{why}: expected a ValueError, your code returned {describe(out)} without an error", hint)

    def tensor(self, x, what, shape=None, dtype=None, shape_hints=()):
        """Fail unless x is a finite tensor of the given shape and dtype. shape_hints: (shape, hint) pairs."""
        if isinstance(x, tuple) and len(x) and torch.is_tensor(x[0]) and shape is not None:
            self.fail(f"{what} should be a tensor of shape {tuple(shape)}, got a tuple of {len(x)}: "
                      f"({', '.join(describe(t) for t in x)})", TUPLE)
        if not torch.is_tensor(x):
            self.fail(f"{what} should be a torch.Tensor, got {describe(x)}", "return one tensor, not a list of them"
                      if isinstance(x, list) and x and all(torch.is_tensor(t) for t in x) else None)
        if shape is not None and tuple(x.shape) != tuple(shape):
            hint = next((h for s, h in shape_hints if tuple(s) == tuple(x.shape)), None)
            self.fail(f"{what} has shape {tuple(x.shape)}, expected {tuple(shape)}", hint)
        if dtype is not None and x.dtype != dtype:
            self.fail(f"{what} has dtype {x.dtype}, expected {dtype}", DOUBLE if x.dtype == torch.float64 else None)
        if x.is_floating_point() and not torch.isfinite(x).all():
            bad = "NaN" if torch.isnan(x).any() else "inf"
            self.fail(f"{what} contains {bad}", NAN if bad == "NaN" else None)
        return x

    def close(self, got, expected, what, hints=(), atol=1e-5, rtol=1e-4, shape_hints=()):
        """Fail unless ``got`` matches the reference output; ``hints``: (hint, thunk giving a wrong output), which
        also name an output of the wrong shape that one of them gives."""
        if torch.is_tensor(got) and got.shape != expected.shape:
            shape_hints = list(shape_hints) + [(got.shape, h) for h, wrong in hints if _same(got, wrong)]
        got = self.tensor(got, what, expected.shape, expected.dtype, shape_hints)
        got = got.detach().to(expected.device)
        if torch.allclose(got, expected, atol=atol, rtol=rtol):
            self.passed()
            return
        hint = None
        for text, wrong in hints:
            try:
                alt = wrong()
                if alt.shape == got.shape and torch.allclose(got, alt.to(got.dtype), atol=atol, rtol=rtol):
                    hint = text
                    break
            except Exception:  # a diagnosis that does not apply to these inputs
                continue
        diff = (got - expected).abs().float()
        index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.ndim else ()
        self.fail(f"wrong {what}: largest difference {diff.max().item():.3g} at index {index} "
                  f"(yours {got[index].item():.4g}, expected {expected[index].item():.4g})", hint)

    def slips(self, *rules):
        """The catalogue's slips of the exercise being checked that break one of ``rules`` (none given: all)."""
        return [s for s in CATALOGUE.get(self.name, ()) if not rules or s.rule in rules]

    @staticmethod
    def named(slips, *args, **kwargs):
        """(slip, thunk) pairs for ``close``'s ``hints``: each slip of a catalogue run on the learner's input."""
        return [(s, functools.partial(s.impl, *args, **kwargs)) for s in slips]

    @staticmethod
    def diagnose(slips, same, run):
        """The first slip whose output is ``same`` as the learner's, or None; ``run(impl)``: a slip's output on the
        learner's input."""
        for s in slips:
            try:
                if same(run(s.impl)):
                    return s
            except Exception:  # a slip that does not apply to this input
                continue
        return None

    def number(self, x, what):
        """A real Python/numpy number (not a tensor), as float."""
        if torch.is_tensor(x):
            self.fail(f"{what} should be a Python number, got {describe(x)}",
                      PLAIN_NUMBER)
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            self.fail(f"{what} should be a number, got {describe(x)}", "a function without a `return` statement "
                      "returns None: end it with `return ...`" if x is None else None)
        if not math.isfinite(float(x)):
            self.fail(f"{what} is {x}", NAN)
        return float(x)

    # nn.Module exercises: build the learner's class, load the reference's weights by name, the attributes kept
    def build(self, cls, *args, **kwargs):
        """Instantiate the learner's class with the contract's constructor, in eval mode."""
        if not isinstance(cls, type):
            self.fail(f"expected your class {self.name} itself (not an instance or a function), got {describe(cls)}")
        module = self.call(cls, *args, **kwargs)
        if not isinstance(module, nn.Module):
            self.fail(f"{cls.__name__}(...) should be an nn.Module", "subclass nn.Module: `class X(nn.Module):`")
        return module.eval()

    def load(self, module, reference, hints=(), rule="names"):
        """Copy the reference's weights into the learner's module; names must be the contract's (timm's).

        A Conv2d patch projection (D, C, P, P) is accepted in place of the Linear one (D, P*P*C).
        ``hints``: (key, hint) pairs explaining a missing or extra name; the key is a substring of a
        parameter name, or a function(missing, extra) -> bool. Failures here belong to ``rule``.
        """
        before = self.rule
        self.phase(rule)
        state, theirs = reference.state_dict(), module.state_dict()
        missing, extra = [k for k in state if k not in theirs], [k for k in theirs if k not in state]
        if missing or extra:
            hint = next((h for key, h in hints if (key(missing, extra) if callable(key) else
                                                   any(key in k for k in missing + extra))), None)
            self.fail(f"the parameter names differ from the course's (timm's) names: "
                      f"missing {missing[:6]}, unexpected {extra[:6]}", hint or
                      "name the layers as the exercise does, so weights can be copied in and compared")
        for key, value in state.items():
            shape = tuple(theirs[key].shape)
            if shape == tuple(value.shape):
                continue
            if len(shape) == 4 and value.ndim == 2 and shape[0] == value.shape[0] and math.prod(shape) == value.numel():
                state[key] = value.reshape(shape[0], shape[2], shape[3], shape[1]).permute(0, 3, 1, 2)  # (D, C, P, P)
                continue
            self.fail(f"parameter `{key}` has shape {shape}, expected {tuple(value.shape)}")
        module.load_state_dict(state)
        self.passed()
        self.rule = before
        return module

    def attributes(self, module, shown, expected, rule="attributes"):
        """The attributes the statement asks ``module`` to keep: ``expected`` is [(name, value, hint)], where value
        is the expected value or a class the attribute must be an instance of. ``shown``: how to name the module."""
        before = self.rule
        self.phase(rule)
        for name, value, hint in expected:
            got = getattr(module, name, None)
            if isinstance(value, type):
                self.ok(isinstance(got, value), f"{shown}.{name} should be an {value.__name__}, got {describe(got)}",
                        hint)
                continue
            got = tuple(got) if isinstance(got, (list, tuple, torch.Size)) else got
            self.ok(got == value, f"{shown}.{name} should be {value!r}, got {describe(got)}",
                    hint or f"store it: self.{name} = {name} (later code reads it)")
        self.rule = before


def _same(got, wrong):
    """True if the thunk ``wrong`` gives ``got`` (False if it raises)."""
    try:
        alt = wrong()
        return alt.shape == got.shape and torch.allclose(got.detach().float(), alt.detach().float().to(got.device))
    except Exception:
        return False


def not_done(name, error):
    """The friendly CheckFailed for an exercise still raising NotImplementedError."""
    which = str(error.args[0]) if error.args and isinstance(error.args[0], str) and error.args[0] else name
    needs = f" ({name} uses it)" if which != name and which.isidentifier() else ""
    which = which if which.isidentifier() else name
    return CheckFailed(f"not done yet: {which}{needs}. Replace `raise NotImplementedError` in the {which} cell "
                       f"with your code, run that cell, then run this check again.")


def check(name):
    """Decorate ``body(checker, learner)`` into the check ``name(learner)``.

    Passing prints one line and returns None; failing raises CheckFailed. The global RNG and the grad mode are left
    as they were (a learner's code that switched gradients off is reported, not left to break the next cell), so a
    check cell never changes the numbers of the cells after it.
    """
    def decorate(body):
        @functools.wraps(body)
        def run(learner):
            checker = Checker(name)
            if learner is None or not callable(learner):
                checker.fail(f"expected your {name} (a function or class), got {describe(learner)}")
            try:
                with torch.random.fork_rng(devices=[]), torch.set_grad_enabled(torch.is_grad_enabled()):
                    torch.manual_seed(0)
                    body(checker, learner)
            except CheckFailed:
                raise
            except NotImplementedError as error:  # raised outside Checker.call, e.g. in a property
                if not is_stub(error):
                    checker.fail(f"could not check your output: NotImplementedError: {error}{where(error)}")
                raise not_done(name, error) from None
            except Exception as error:  # learner output the check could not even inspect
                checker.fail(f"could not check your output: {type(error).__name__}: {error}{where(error)}")
            finally:
                run.rules_seen = checker.rules_seen  # the rules this run tested (the checks' own tests read them)
            print(f"✔ {name}: passed")
        run.__doc__ = f"Check your ``{name}``. " + (body.__doc__ or "")
        return run
    return decorate
