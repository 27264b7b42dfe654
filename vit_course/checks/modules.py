"""What the checks of modules share (chapters 01-05): building the learner's class, copying the reference's weights
into it by name, randomised LayerNorms, the dropout probe (eval mode off, training mode on) and the
``attention_weights`` method's test."""

import functools
import inspect

import torch


def accepts(fn, name):
    """True if ``fn`` takes a keyword argument ``name`` (or **kwargs, or its signature is unknown)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def randomize_norms(module, generator):
    """Give every LayerNorm a random scale and shift, so a shared or missing norm cannot pass."""
    with torch.no_grad():
        for sub in module.modules():
            if "LayerNorm" in type(sub).__name__ and getattr(sub, "weight", None) is not None:
                sub.weight.copy_(torch.rand(sub.weight.shape, generator=generator) + 0.5)
                sub.bias.copy_(torch.randn(sub.bias.shape, generator=generator) * 0.5)
    return module


def twins(slips, reference, args, *inputs, **kwargs):
    """(slip, thunk) pairs for ``Checker.close``: each slip (a module class) built with ``args`` and the reference's
    weights, in eval mode, run on the learner's input."""
    def output(slip):
        twin = slip.impl(*args).eval()
        twin.load_state_dict(reference.state_dict())
        return twin(*inputs, **kwargs)
    return [(s, functools.partial(output, s)) for s in slips]


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


WEIGHTS_MASK = "the mask seems not to reach the weights: pass it on to the attention"


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
    if mask is not None and required and not accepts(method, "mask"):
        c.fail(f"{label}.attention_weights takes no mask argument", f"write {required}, as the exercise asks: "
               "pass the mask on to the attention, as forward does")
    if mask is not None and accepts(method, "mask"):
        got = c.call(method, x, mask=mask, label=f"{label}.attention_weights")
        c.close(got, masked, "weights from attention_weights with a mask",
                [(WEIGHTS_MASK, lambda: weights)])
