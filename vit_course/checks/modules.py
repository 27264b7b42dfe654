"""What the checks of modules share (chapters 01-05): building the learner's class, copying the reference's weights
into it by name, and the attributes a statement asks a module to keep. Mixed into ``core.Checker``."""

import math

import torch
from torch import nn

from .messages import describe


class ModuleChecks:
    """``Checker``'s methods for nn.Module exercises (they use its ``call``, ``fail``, ``ok`` and ``phase``)."""

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
        self.tests += 1
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
