"""Checks of vit_course/blocks.py's parts of the block (chapter 03): MLP, LayerNorm, DropPath."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from torch import nn

from .. import blocks as ref
from .core import check
from .gradients import CUT, cut_hint, gradient_flow, same_gradient
from .messages import describe, where
from .modules import check_dropout, only_biases, randomize_norms
from .wiring import dropout_wiring

MLP_EVAL = ("dropout is applied in eval mode: use the nn.Dropout modules drop1 and drop2 (they know the mode), "
            "not F.dropout(x, p)")
MLP_TRAIN = "drop seems ignored: apply self.drop1 after the activation and self.drop2 after fc2"


@check("MLP")
def MLP(c, cls):
    """MLP(dim, hidden_dim, drop=0.): fc1 -> exact GELU -> dropout -> fc2 -> dropout, on any leading shape;
    gradients reach x, fc1 and fc2."""
    g = torch.Generator().manual_seed(6)
    for dim, hidden, shape in ((6, 24, (2, 5)), (5, 3, (7,)), (8, 32, (2, 3, 4))):
        reference = ref.MLP(dim, hidden).eval()
        model = c.build(cls, dim, hidden)
        c.load(model, reference, [
            (only_biases, "the Linear layers need their bias: nn.Linear(dim, hidden_dim) (bias=True is the default)"),
            ("fc", "name the two Linear layers fc1 (dim -> hidden_dim) and fc2 (back to dim)")])
        x = torch.randn(*shape, dim, generator=g) * 2
        fc1, fc2 = reference.fc1, reference.fc2
        with torch.no_grad():
            c.close(c.call(model, x, label=f"MLP({dim}, {hidden})"), reference(x), "output", [
                ("this is the MLP with ReLU: ViT uses the exact GELU, nn.GELU()", lambda: fc2(F.relu(fc1(x)))),
                ("this is the MLP with the tanh approximation of GELU: use the exact one, nn.GELU() "
                 "(approximate='none')", lambda: fc2(F.gelu(fc1(x), approximate="tanh"))),
                ("there is no activation between fc1 and fc2: add nn.GELU()", lambda: fc2(fc1(x))),
                ("the activation is applied after fc2 as well (or only there): it goes between fc1 and fc2",
                 lambda: F.gelu(fc2(F.gelu(fc1(x))))),
                ("the input is added to the MLP's output: the residual belongs to the encoder block, the MLP returns "
                 "fc2's output alone", lambda: x + fc2(F.gelu(fc1(x)))),
            ], atol=1e-5)
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=f"MLP({dim}, {hidden})"),
                      lambda t: reference(t["x"]), dict(x=x), model, reference)
    c.phase("dropout")
    reference = ref.MLP(8, 16, drop=0.5).eval()
    model = c.load(c.build(cls, 8, 16, drop=0.5), reference)
    x = torch.randn(4, 3, 8, generator=g)
    with torch.no_grad():
        check_dropout(c, model, x, reference(x), "with drop=0.5", MLP_EVAL, MLP_TRAIN, "MLP(8, 16, drop=0.5)")
    dropout_wiring(c, model, reference, x, "MLP(8, 16, drop=0.5)", {
        (0.5, (4, 3, 16)): "the dropout after GELU (drop1)", (0.5, (4, 3, 8)): "the dropout after fc2 (drop2)"},
        "fc1, GELU, dropout, fc2, dropout: x = self.drop1(self.act(self.fc1(x))); return self.drop2(self.fc2(x))")
    named = sorted(name for name, sub in model.named_children() if isinstance(sub, nn.Dropout))
    c.ok(not named or named == ["drop1", "drop2"], f"your MLP's dropout modules are {named}, the statement's "
         "are drop1 and drop2", "two modules, drop1 = nn.Dropout(drop) after the activation and drop2 = "
         "nn.Dropout(drop) after fc2 (timm's names: one shared module reads as a single dropout)")


@check("LayerNorm")
def LayerNorm(c, cls):
    """LayerNorm(dim, eps=1e-6): parameters weight (ones) and bias (zeros); normalise each token over its features,
    biased variance, then weight and bias; gradients reach x, weight and bias."""
    g = torch.Generator().manual_seed(7)
    _layer_norm_parameters(c, cls)
    c.phase("output")
    for dim, eps, shape in ((5, 1e-6, (2, 3)), (8, 0.1, (4,)), (3, 1e-6, (2, 2, 2))):
        reference = ref.LayerNorm(dim, eps=eps)
        randomize_norms(reference, g)
        model = c.build(cls, dim, eps=eps)
        c.load(model, reference, [("", "LayerNorm has two parameters of size dim, `weight` (ones) and `bias` (zeros)")])
        x = torch.randn(*shape, dim, generator=g) * 3 + 1
        w, b = reference.weight.detach(), reference.bias.detach()
        mean = x.mean(-1, keepdim=True)
        with torch.no_grad():
            c.close(c.call(model, x, label=f"LayerNorm({dim}, eps={eps})"), F.layer_norm(x, (dim,), w, b, eps),
                    "output", [
                        ("this uses the unbiased variance (divides by dim - 1): LayerNorm uses the biased one, "
                         "`x.var(-1, unbiased=False)`", lambda: (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps)
                         * w + b),
                        ("eps is added to the standard deviation: it belongs inside the square root, "
                         "sqrt(var + eps)", lambda: (x - mean) / (x.std(-1, unbiased=False, keepdim=True) + eps)
                         * w + b),
                        ("weight and bias are not applied: scale by `weight` and shift by `bias` at the end",
                         lambda: F.layer_norm(x, (dim,), eps=eps)),
                        ("eps seems ignored or hard-coded: use the eps given to the constructor",
                         lambda: F.layer_norm(x, (dim,), w, b, 1e-5 if eps != 1e-5 else 1e-6)),
                        ("eps seems ignored or hard-coded: use the eps given to the constructor",
                         lambda: F.layer_norm(x, (dim,), w, b, 0.0)),
                        ("the mean and variance are taken over the whole tensor: normalise each token over its own "
                         "features, x.mean(-1, keepdim=True)", lambda: (x - x.mean()) / torch.sqrt(
                             x.var(unbiased=False) + eps) * w + b),
                        ("the bias is not added: scale by `weight`, then shift by `bias`",
                         lambda: F.layer_norm(x, (dim,), w, None, eps)),
                        ("the variance is the mean of x squared, E[x^2]: take it of the centred x, "
                         "((x - mean) ** 2).mean(-1), or x.var(-1, unbiased=False)",
                         lambda: (x - mean) / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w + b),
                        ("the mean and variance are taken over the wrong axis: normalise each token over its "
                         "own features, the last axis", lambda: (x - x.mean(0, keepdim=True)) / torch.sqrt(
                             x.var(0, unbiased=False, keepdim=True) + eps) * w + b),
                    ])
        constant = torch.full((2, dim), 3.0)
        with torch.no_grad():
            got = c.call(model, constant, label=f"LayerNorm({dim}, eps={eps})")
        c.close(got, F.layer_norm(constant, (dim,), w, b, eps), "output for tokens whose features are all equal "
                "(variance 0: eps keeps the division finite)")
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=f"LayerNorm({dim}, eps={eps})"),
                      lambda t: reference(t["x"]), dict(x=x), model, reference)
    _layer_norm_defaults(c, cls, g)


def _layer_norm_parameters(c, cls):
    """A fresh LayerNorm(6) has learnable `weight` and `bias` (nn.Parameter, so they are trained and saved)."""
    c.phase("parameters")
    model = c.build(cls, 6)
    for name, init in (("weight", "ones"), ("bias", "zeros")):
        tensor = getattr(model, name, None)
        c.ok(isinstance(tensor, nn.Parameter), f"`{name}` should be an nn.Parameter, got {describe(tensor)}",
             f"self.{name} = nn.Parameter(torch.{init}(dim)): a plain tensor is neither learned nor saved")
    return model


def _layer_norm_defaults(c, cls, g):
    """A fresh LayerNorm(6) starts with weight ones and bias zeros, and its eps is 1e-6 by default."""
    c.phase("parameters")
    model = c.build(cls, 6)
    for name, value in (("weight", 1.0), ("bias", 0.0)):
        tensor = getattr(model, name).detach()
        c.ok(tuple(tensor.shape) == (6,) and bool(torch.all(tensor == value)), f"a new LayerNorm(6) should start "
             f"with `{name}` all {value:g}, shape (6,); got {describe(tensor)} with values from "
             f"{tensor.min().item():.3g} to {tensor.max().item():.3g}",
             f"torch.{'ones' if value else 'zeros'}(dim): a new norm only standardises")
    c.phase("eps")
    x = torch.randn(3, 6, generator=g) * 1e-3  # variance about 1e-6: eps matters
    with torch.no_grad():
        got = c.call(model, x, label="LayerNorm(6)")
    c.close(got, F.layer_norm(x, (6,), eps=1e-6), "output of LayerNorm(6), with the default eps", [
        ("the default eps is not 1e-6: write the signature LayerNorm(dim, eps=1e-6) (ViT's and timm's value; "
         "PyTorch's default is 1e-5)", lambda: F.layer_norm(x, (6,), eps=1e-5))], atol=1e-4)


@check("DropPath")
def DropPath(c, cls):
    """DropPath(p): ValueError unless 0 <= p < 1; eval mode or p = 0: identity; in training, zero whole samples of
    any shape (b, ...) with probability p, scale the rest by 1/(1-p); gradients reach x."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4000, 3, 5, generator=g) + 3  # no exact zeros
    for p in (0.0, 0.25, 0.6):
        module = c.build(cls, p)
        label = f"DropPath({p})"
        c.phase("eval")
        with torch.no_grad():
            out = c.call(module, x, label=label + " in eval mode")
            c.tensor(out, "output in eval mode", x.shape, x.dtype)
            c.ok(torch.equal(out, x), "in eval mode the output should be the input unchanged",
                 "DropPath is only active in training: return x when `not self.training` (or p == 0)")
            module.train()
            out = c.tensor(c.call(module, x, label=label + " in training mode"), "output in training mode",
                           x.shape, x.dtype)
            module.eval()
        if p == 0.0:
            c.ok(torch.allclose(out, x), "with p=0 nothing should be dropped or scaled, even in training")
            continue
        c.phase("training")
        _dropped_whole(c, out, x, p)
        flat = torch.randn(3000, 7, generator=g) + 3  # (b, features): the mask must follow x's number of axes
        module.train()
        with torch.no_grad():
            got = c.call(module, flat, label=label + " in training mode")
        module.eval()
        c.tensor(got, "output for x of shape (3000, 7) in training mode", flat.shape, flat.dtype, [
            ((3000, 3000, 7), "the mask's shape is hard-coded for 3-D x: give it x.ndim axes, (b, 1, ..., 1), "
                              "e.g. (x.shape[0],) + (1,) * (x.ndim - 1)")])
        _dropped_whole(c, got, flat, p)
        _drop_path_gradient(c, cls, module, p, g)
    c.phase("error")
    for p in (1.0, -0.1):
        c.raises(cls, p, why=f"p={p} is not a probability below 1", label="DropPath",
                 hint="in __init__, raise a ValueError unless 0 <= p < 1 (p = 1 would drop everything and divide by 0)")
    c.phase("p")
    module = c.build(cls, 0.25)
    try:  # print(model) calls the given extra_repr, which reads self.p
        repr(module)
    except Exception as error:
        c.fail(f"print(DropPath(0.25)) raised {type(error).__name__}: {error}{where(error)}", "keep the "
               "probability as self.p = p: the given extra_repr reads it")
    c.ok(getattr(module, "p", None) == 0.25, "DropPath(0.25).p should be 0.25, got "
         f"{describe(getattr(module, 'p', None))}", "keep the probability as self.p = p: the "
         "given extra_repr (what print(model) shows) and the ViT's checks read it")


def _dropped_whole(c, out, x, p):
    """Each sample of ``out`` is its sample of ``x`` dropped whole or scaled by 1/(1-p), about p of them dropped."""
    flat = (out / x).flatten(1)  # (b, values): 0 or 1/(1-p) for a correct sample
    dropped = (flat == 0).all(1)
    kept = ~dropped
    mixed = ~dropped & (flat == 0).any(1)
    c.ok(not mixed.any(), f"{int(mixed.sum())} samples were partly zeroed: DropPath drops a sample's whole "
         "residual branch", "draw one coin per sample, a mask of shape (batch, 1, 1, ...), not one per element "
         "(that would be dropout)")
    c.ok(0 < int(dropped.sum()) < len(x), f"with p={p} all {len(x)} samples were "
         f"{'dropped' if dropped.all() else 'kept'} together", "draw one coin per sample, a mask of shape "
         "(batch, 1, 1, ...), not one coin for the whole batch")
    scale = flat[kept]
    c.ok(not torch.allclose(scale, torch.ones_like(scale)), "the kept samples are not scaled",
         f"divide the kept samples by (1 - p) = {1 - p:g}, so the expected output equals the input")
    c.ok(not torch.allclose(scale, torch.full_like(scale, 1 - p)), "the kept samples are multiplied by (1 - p)",
         f"divide by the keep probability (1 - p) = {1 - p:g}, don't multiply")
    c.ok(torch.allclose(scale, torch.full_like(scale, 1 / (1 - p)), rtol=1e-5),
         f"the kept samples should be scaled by 1 / (1 - p) = {1 / (1 - p):.4g}, got factors between "
         f"{scale.min().item():.4g} and {scale.max().item():.4g}")
    rate, sd = dropped.float().mean().item(), (p * (1 - p) / len(x)) ** 0.5
    c.ok(abs(rate - p) < 5 * sd, f"with p={p} about {p:.0%} of the samples should be dropped, you dropped "
         f"{rate:.1%}", "p is the probability to drop (bernoulli of 1 - p keeps)" if abs(rate - (1 - p)) < 5 * sd
         else None)


def _drop_path_gradient(c, cls, module, p, g):
    """In training mode the gradient reaching x is the output's own factor per sample: 0 or 1/(1-p)."""
    before = c.rule
    c.phase("gradient")
    x = (torch.randn(64, 3, 4, generator=g) + 3).requires_grad_()
    module.train()
    try:
        with torch.enable_grad():
            out = c.tensor(c.call(module, x, label=f"DropPath({p}) in training mode"), "output in training mode",
                           x.shape)
            if not out.requires_grad:
                c.fail(f"the output carries no gradient at all (it does not require grad): {CUT}", cut_hint(cls))
            weight = torch.randn(x.shape, generator=g)
            (out * weight).sum().backward()
    finally:
        module.eval()
    same_gradient(c, "x", x.grad, weight * (out.detach() / x.detach()), cls)
    c.tests += 1
    c.rule = before
