"""Chapter 03's exercises: MLP, LayerNorm, DropPath and their assembly EncoderBlock (pre-norm residuals,
options, drop path while training): checks and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from torch import nn

from .. import blocks as ref
from .ch01_self_attention import random_mask
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


OPTIONS = dict(qkv_bias=False, drop=0.5, attn_drop=0.5, drop_path=0.5, init_values=0.1)
SHOWN = ", ".join(f"{k}={v}" for k, v in OPTIONS.items())


def _block_variants(m, x, mask=None):
    """(hint, thunk) pairs: the encoder-block mistakes learners make, built from the reference's parts."""
    attn = lambda y: m.attn(y, mask=mask)  # noqa: E731
    mlp, n1, n2 = m.mlp, m.norm1, m.norm2

    def post_norm():
        y = n1(x + attn(x))
        return n2(y + mlp(y))

    def shared_norm():
        y = x + attn(n1(x))
        return y + mlp(n1(y))

    def norm_in_residual():
        y = n1(x) + attn(n1(x))
        return n2(y) + mlp(n2(y))

    def mlp_first():
        y = x + mlp(n2(x))
        return y + attn(n1(y))

    def residual_normalised():
        y = n1(x)
        y = y + attn(y)
        return y + mlp(n2(y))

    parallel = lambda: x + attn(n1(x)) + mlp(n2(x))  # noqa: E731
    mlp_unnormalised = lambda: (lambda y: y + mlp(y))(x + attn(n1(x)))  # noqa: E731
    no_attn_res = lambda: (lambda y: y + mlp(n2(y)))(attn(n1(x)))  # noqa: E731
    no_mlp_res = lambda: mlp(n2(x + attn(n1(x))))  # noqa: E731
    no_res = lambda: mlp(n2(attn(n1(x))))  # noqa: E731
    return [
        ("this is a post-norm block (norm after the residual sum): ViT normalises first, "
         "x = x + attn(norm1(x)); x = x + mlp(norm2(x))", post_norm),
        ("the same LayerNorm is used twice: the block has two, norm1 before attention and norm2 before the MLP",
         shared_norm),
        ("the residual adds the normalised x: add the branch to x itself, x = x + attn(norm1(x))", norm_in_residual),
        ("the residual connection around attention is missing: x = x + attn(norm1(x))", no_attn_res),
        ("the residual connection around the MLP is missing: x = x + mlp(norm2(x))", no_mlp_res),
        ("both residual connections are missing: x = x + attn(norm1(x)); x = x + mlp(norm2(x))", no_res),
        ("the MLP comes before attention: attention first, then the MLP", mlp_first),
        ("the residual stream is the normalised x: normalise only the branch's input, x = x + attn(norm1(x))",
         residual_normalised),
        ("both branches read the same x (a parallel block): the MLP reads the x updated by attention, "
         "x = x + attn(norm1(x)); x = x + mlp(norm2(x))", parallel),
        ("the MLP reads x without its LayerNorm: x = x + mlp(norm2(x))", mlp_unnormalised),
    ]


@check("EncoderBlock")
def EncoderBlock(c, cls):
    """EncoderBlock(dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
    init_values=None): pre-norm, x = x + drop_path1(ls1(attn(norm1(x)))); x = x + drop_path2(ls2(mlp(norm2(x))));
    the mask reaches the attention; gradients reach x and every parameter."""
    g = torch.Generator().manual_seed(9)
    for dim, heads, ratio, batch, n in ((12, 3, 2.0, 2, 7), (8, 2, 4.0, 1, 5), (6, 1, 1.5, 3, 4)):
        reference = randomize_norms(ref.EncoderBlock(dim, heads, ratio).eval(), g)
        model = c.build(cls, dim, heads, ratio)
        c.load(model, reference, [
            ("norm", "two LayerNorms, norm1 (before attention) and norm2 (before the MLP)"),
            ("attn", "the attention is `attn`, a MultiHeadAttention with `qkv` and `proj`"),
            ("mlp", "the MLP is `mlp`, with `fc1` and `fc2` (hidden width int(dim * mlp_ratio))")])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"EncoderBlock({dim}, {heads}, {ratio})"
        with torch.no_grad():
            c.close(c.call(model, x, label=label), reference(x), "output", _block_variants(reference, x), atol=1e-4)
            c.phase("mask")
            mask = random_mask((n, n), g)
            c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                    _block_variants(reference, x, mask) + [
                        ("the mask seems not to reach the attention: pass it on, self.attn(..., mask=mask)",
                         lambda: reference(x))], atol=1e-4)
            c.phase("output")
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label), lambda t: reference(t["x"]),
                      dict(x=x), model, reference)
    _options(c, cls, g)
    _drop_path(c, cls, g)
    _dropouts(c, cls, g)


def _options(c, cls, g):
    """Every option at once, in eval mode: qkv_bias off, LayerScale on, dropout and drop path off (eval)."""
    c.phase("options")
    reference = randomize_norms(ref.EncoderBlock(8, 2, 2.0, **OPTIONS).eval(), g)
    with torch.no_grad():  # distinct LayerScales, so a missing or swapped one shows
        reference.ls1.gamma.uniform_(0.5, 1.5, generator=g)
        reference.ls2.gamma.uniform_(-1.5, -0.5, generator=g)
    model = c.build(cls, 8, 2, 2.0, **OPTIONS)
    c.load(model, reference, [
        ("qkv.bias", "qkv_bias=False seems ignored: pass it on, MultiHeadAttention(dim, num_heads, "
                     "qkv_bias=qkv_bias, ...)"),
        ("ls", "with init_values set, ls1 and ls2 are LayerScale(dim, init_values); without, nn.Identity()")],
        rule="options")
    x = torch.randn(3, 5, 8, generator=g)
    label = f"EncoderBlock(8, 2, 2.0, {SHOWN})"
    attn, mlp = (lambda y: reference.attn(reference.norm1(y))), (lambda y: reference.mlp(reference.norm2(y)))

    def block(ls1=reference.ls1, ls2=reference.ls2):
        y = x + ls1(attn(x))
        return y + ls2(mlp(y))

    with torch.no_grad():
        got = c.call(model, x, label=f"{label} in eval mode")
        c.ok(torch.equal(c.tensor(got, "output in eval mode", x.shape), c.call(model, x, label=label)),
             "in eval mode two calls on the same input gave different outputs",
             "dropout or drop path is on in eval mode: use the nn.Dropout and DropPath modules, which are off "
             "in eval mode")
        c.close(got, reference(x), f"output in eval mode with {SHOWN}", [
            ("LayerScale is not applied: x = x + drop_path1(ls1(attn(norm1(x)))), and ls2 on the MLP branch",
             lambda: block(lambda t: t, lambda t: t)),
            ("ls1 and ls2 are swapped: ls1 scales the attention branch, ls2 the MLP branch",
             lambda: block(reference.ls2, reference.ls1))], atol=1e-4)


def _drop_path(c, cls, g):
    """drop_path=0.5 while training: each sample keeps or drops each residual branch whole (kept ones x 2)."""
    c.phase("drop_path")
    reference = randomize_norms(ref.EncoderBlock(8, 2, 2.0, drop_path=0.5).eval(), g)
    model = c.load(c.build(cls, 8, 2, 2.0, drop_path=0.5), reference)
    x = torch.randn(64, 3, 8, generator=g)
    label = "EncoderBlock(8, 2, 2.0, drop_path=0.5)"
    with torch.no_grad():
        model.train()
        try:
            out = c.tensor(c.call(model, x, label=f"{label} in training mode"), "output in training mode", x.shape)
        finally:
            model.eval()
        attn, mlp = (lambda y: reference.attn(reference.norm1(y))), (lambda y: reference.mlp(reference.norm2(y)))

        def fits(around_sum=False):  # {(attention kept, MLP kept): (b,) bool, the sample matches}
            found = {}
            for a in (0, 2):
                y = a * (x + attn(x)) if around_sum else x + a * attn(x)
                for m in (0, 2):
                    z = m * (y + mlp(y)) if around_sum else y + m * mlp(y)
                    found[a, m] = (z - out).abs().flatten(1).amax(1) < 1e-4
            return found

        ignored = ("drop_path seems ignored: drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity(), "
                   "and the same for drop_path2, each applied to its branch")
        c.ok(not torch.allclose(out, reference(x), atol=1e-5), "in training mode with drop_path=0.5 no residual "
             "branch was ever dropped", ignored)
        found = fits()
        matched = torch.stack(list(found.values())).any(0)
        if not matched.all():
            hint = ("DropPath is applied to x + branch: it goes on the residual branch alone, x = x + "
                    "drop_path1(ls1(attn(norm1(x))))" if torch.stack(list(fits(True).values())).any(0).all() else
                    "drop or keep each residual branch whole, scaled by 1/(1-p): x = x + drop_path1(ls1(attn(norm1("
                    "x)))); x = x + drop_path2(ls2(mlp(norm2(x))))")
            c.fail(f"in training mode, {int((~matched).sum())} of {len(x)} samples are not x plus each residual "
                   "branch either dropped or kept (and scaled by 1/(1-p) = 2)", hint)
        c.ok(not found[2, 2].all(), "in training mode with drop_path=0.5 no residual branch was ever dropped",
             ignored)


def _dropouts(c, cls, g):
    """drop=0.1 and attn_drop=0.3 while training: the attention's weights and proj and the MLP's two places get their
    rates (dropouts made deterministic); both LayerNorms have eps 1e-6."""
    c.phase("eps")
    reference = randomize_norms(ref.EncoderBlock(8, 2, 2.0, drop=0.1, attn_drop=0.3).eval(), g)
    model = c.load(c.build(cls, 8, 2, 2.0, drop=0.1, attn_drop=0.3), reference)
    for name in ("norm1", "norm2"):
        eps = getattr(getattr(model, name, None), "eps", 1e-6)
        c.ok(eps == 1e-6, f"{name}.eps is {eps:g}, the statement's is 1e-6", f"{name} = nn.LayerNorm(dim, eps=1e-6): "
             "PyTorch's default eps is 1e-5, ViT's (and timm's) 1e-6")
    c.phase("dropout")
    x = torch.randn(3, 5, 8, generator=g)
    after = "after the attention's proj (proj_drop=drop) or after the MLP's fc2 (MLP(..., drop=drop))"
    dropout_wiring(c, model, reference, x, "EncoderBlock(8, 2, 2.0, drop=0.1, attn_drop=0.3)", {
        (0.3, (3, 2, 5, 5)): "attn_drop=0.3 on the attention weights (attn_drop=attn_drop)",
        (0.1, (3, 5, 8)): f"drop=0.1 {after}",
        (0.1, (3, 5, 16)): "drop=0.1 in the MLP after GELU (MLP(..., drop=drop))"},
        "pass the rates on: MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop) "
        "and MLP(dim, int(dim * mlp_ratio), drop=drop)")


# each exercise's rules: the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule)
# and the words that state it in the exercise's statement
RULES = {
    "MLP": {
        "names": "`fc1 = nn.Linear(dim, hidden_dim)`",
        "output": "fc1, GELU, dropout, fc2, dropout",
        "dropout": "`drop1 = nn.Dropout(drop)`",
        "gradient": "gradients flow back to `x`, `fc1` and `fc2`",
    },
    "LayerNorm": {
        "names": "parameters `weight` (ones, shape `(dim,)`) and `bias` (zeros)",
        "parameters": "parameters `weight` (ones, shape `(dim,)`) and `bias` (zeros)",
        "output": "as in the formula above",
        "eps": "`LayerNorm(dim, eps=1e-6)`",
        "gradient": "gradients flow back to `x`, `weight` and `bias`",
    },
    "DropPath": {
        "eval": "In eval mode, or with $p = 0$, return `x` unchanged",
        "training": "in training mode multiply each sample by its own 0-or-1 mask and divide by $1 - p$",
        "error": "raise a `ValueError` unless $0 \\le p < 1$",
        "p": "keep the probability as `self.p`",
        "gradient": "Gradients flow back to `x`",
    },
    "EncoderBlock": {
        "names": "with timm's names",
        "output": "apply the two pre-norm residual updates of section 1",
        "mask": "passing `mask` to the attention",
        "options": "`ls1`, a `LayerScale(dim, init_values)` if `init_values` else `nn.Identity()`",
        "drop_path": "`drop_path1`, a `DropPath(drop_path)` if `drop_path > 0` else `nn.Identity()`",
        "eps": "`norm1 = nn.LayerNorm(dim, eps=1e-6)`",
        "dropout": "`attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, "
                   "proj_drop=drop)`",
        "gradient": "Gradients flow back to `x` and every parameter",
    },
}
