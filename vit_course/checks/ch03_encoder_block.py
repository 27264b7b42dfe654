"""Chapter 03's exercises: MLP, LayerNorm, DropPath and their assembly EncoderBlock (pre-norm residuals,
options, drop path while training): checks and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import contextlib
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import blocks as ref
from .ch01_self_attention import random_mask
from .core import IN_PLACE, Slip, Variant, check
from .gradients import CUT, CUT_AT, cut_hint, gradient_flow, same_gradient
from .messages import describe, where
from .modules import check_dropout, only_biases, randomize_norms, twins
from .wiring import dropout_wiring

BLOCK_NAMES = "name the two Linear layers fc1 (dim -> hidden_dim) and fc2 (back to dim)"
BLOCK_NO_BIAS = "the Linear layers need their bias: nn.Linear(dim, hidden_dim) (bias=True is the default)"
BLOCK_NO_DROP2 = ("fc1, GELU, dropout, fc2, dropout: x = self.drop1(self.act(self.fc1(x))); return "
                  "self.drop2(self.fc2(x))")
BLOCK_ONE_DROPOUT = ("two modules, drop1 = nn.Dropout(drop) after the activation and drop2 = nn.Dropout(drop) after "
                     "fc2 (timm's names: one shared module reads as a single dropout)")
BLOCK_EPS_PARAMETER = "LayerNorm has two parameters of size dim, `weight` (ones) and `bias` (zeros)"
BLOCK_IN_EVAL = "DropPath is only active in training: return x when `not self.training` (or p == 0)"
BLOCK_ELEMENTWISE = ("draw one coin per sample, a mask of shape (batch, 1, 1, ...), not one per element (that would "
                     "be dropout)")
BLOCK_ONE_COIN = "draw one coin per sample, a mask of shape (batch, 1, 1, ...), not one coin for the whole batch"
BLOCK_MASK_3D = ("the mask's shape is hard-coded for 3-D x: give it x.ndim axes, (b, 1, ..., 1), e.g. (x.shape[0],) + "
                 "(1,) * (x.ndim - 1)")
BLOCK_NO_CHECK = "in __init__, raise a ValueError unless 0 <= p < 1 (p = 1 would drop everything and divide by 0)"
BLOCK_DROP_PROB = "keep the probability as self.p = p: the given extra_repr reads it"
BLOCK_LN1 = "two LayerNorms, norm1 (before attention) and norm2 (before the MLP)"
BLOCK_QKV_BIAS = "qkv_bias=False seems ignored: pass it on, MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, ...)"
BLOCK_IGNORED = ("drop_path seems ignored: drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity(), and "
                 "the same for drop_path2, each applied to its branch")
BLOCK_NO_PROJ_DROP = ("pass the rates on: MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, "
                      "proj_drop=drop) and MLP(dim, int(dim * mlp_ratio), drop=drop)")
KEEP_IS_P = "p is the probability to drop (bernoulli of 1 - p keeps)"
NO_LAYERSCALE = "with init_values set, ls1 and ls2 are LayerScale(dim, init_values); without, nn.Identity()"
EVAL_RANDOM = ("dropout or drop path is on in eval mode: use the nn.Dropout and DropPath modules, which are off "
               "in eval mode")
PLAIN_TENSOR = "a plain tensor is neither learned nor saved"
NEW_NORM = "a new norm only standardises"
UNBIASED = "so the expected output equals the input"
NO_MULTIPLY = "don't multiply"
EPS_DEFAULT = "PyTorch's default eps is 1e-5, ViT's (and timm's) 1e-6"
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
            (only_biases, BLOCK_NO_BIAS),
            ("fc", BLOCK_NAMES)])
        x = torch.randn(*shape, dim, generator=g) * 2
        with torch.no_grad():
            c.close(c.call(model, x, label=f"MLP({dim}, {hidden})"), reference(x), "output",
                    twins(c.slips("output"), reference, (dim, hidden), x))
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
        BLOCK_NO_DROP2)
    named = sorted(name for name, sub in model.named_children() if isinstance(sub, nn.Dropout))
    c.ok(not named or named == ["drop1", "drop2"], f"your MLP's dropout modules are {named}, the statement's "
         "are drop1 and drop2", BLOCK_ONE_DROPOUT)


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
        c.load(model, reference, [("", BLOCK_EPS_PARAMETER)])
        x = torch.randn(*shape, dim, generator=g) * 3 + 1
        w, b = reference.weight.detach(), reference.bias.detach()
        with torch.no_grad():
            c.close(c.call(model, x, label=f"LayerNorm({dim}, eps={eps})"), F.layer_norm(x, (dim,), w, b, eps),
                    "output", twins(c.slips("output"), reference, (dim, eps), x))
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
             f"self.{name} = nn.Parameter(torch.{init}(dim)): {PLAIN_TENSOR}")


def _layer_norm_defaults(c, cls, g):
    """A fresh LayerNorm(6) starts with weight ones and bias zeros, and its eps is 1e-6 by default."""
    c.phase("parameters")
    model = c.build(cls, 6)
    for name, value in (("weight", 1.0), ("bias", 0.0)):
        tensor = getattr(model, name).detach()
        c.ok(tuple(tensor.shape) == (6,) and bool(torch.all(tensor == value)), f"a new LayerNorm(6) should start "
             f"with `{name}` all {value:g}, shape (6,); got {describe(tensor)} with values from "
             f"{tensor.min().item():.3g} to {tensor.max().item():.3g}",
             f"torch.{'ones' if value else 'zeros'}(dim): {NEW_NORM}")
    c.phase("eps")
    x = torch.randn(3, 6, generator=g) * 1e-3  # variance about 1e-6: eps matters
    with torch.no_grad():
        got = c.call(model, x, label="LayerNorm(6)")
    c.close(got, F.layer_norm(x, (6,), eps=1e-6), "output of LayerNorm(6), with the default eps",
            twins(c.slips("eps"), ref.LayerNorm(6), (6,), x), atol=1e-4)


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
            c.ok(torch.equal(out, x), "in eval mode the output should be the input unchanged", BLOCK_IN_EVAL)
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
            ((3000, 3000, 7), BLOCK_MASK_3D)])
        _dropped_whole(c, got, flat, p)
        _drop_path_gradient(c, cls, module, p, g)
    c.phase("error")
    for p in (1.0, -0.1):
        c.raises(cls, p, why=f"p={p} is not a probability below 1", label="DropPath", hint=BLOCK_NO_CHECK)
    c.phase("p")
    module = c.build(cls, 0.25)
    try:  # print(model) calls the given extra_repr, which reads self.p
        repr(module)
    except Exception as error:
        c.fail(f"print(DropPath(0.25)) raised {type(error).__name__}: {error}{where(error)}", BLOCK_DROP_PROB)
    c.attributes(module, "DropPath(0.25)", [("p", 0.25, "keep the probability as self.p = p: the given extra_repr "
                                             "(what print(model) shows) and the ViT's checks read it")], rule="p")


def _dropped_whole(c, out, x, p):
    """Each sample of ``out`` is its sample of ``x`` dropped whole or scaled by 1/(1-p), about p of them dropped."""
    flat = (out / x).flatten(1)  # (b, values): 0 or 1/(1-p) for a correct sample
    dropped = (flat == 0).all(1)
    kept = ~dropped
    mixed = ~dropped & (flat == 0).any(1)
    c.ok(not mixed.any(), f"{int(mixed.sum())} samples were partly zeroed: DropPath drops a sample's whole "
         "residual branch", BLOCK_ELEMENTWISE)
    c.ok(0 < int(dropped.sum()) < len(x), f"with p={p} all {len(x)} samples were "
         f"{'dropped' if dropped.all() else 'kept'} together", BLOCK_ONE_COIN)
    scale = flat[kept]
    c.ok(not torch.allclose(scale, torch.ones_like(scale)), "the kept samples are not scaled",
         f"divide the kept samples by (1 - p) = {1 - p:g}, {UNBIASED}")
    c.ok(not torch.allclose(scale, torch.full_like(scale, 1 - p)), "the kept samples are multiplied by (1 - p)",
         f"divide by the keep probability (1 - p) = {1 - p:g}, {NO_MULTIPLY}")
    c.ok(torch.allclose(scale, torch.full_like(scale, 1 / (1 - p)), rtol=1e-5),
         f"the kept samples should be scaled by 1 / (1 - p) = {1 / (1 - p):.4g}, got factors between "
         f"{scale.min().item():.4g} and {scale.max().item():.4g}")
    rate, sd = dropped.float().mean().item(), (p * (1 - p) / len(x)) ** 0.5
    c.ok(abs(rate - p) < 5 * sd, f"with p={p} about {p:.0%} of the samples should be dropped, you dropped "
         f"{rate:.1%}", KEEP_IS_P if abs(rate - (1 - p)) < 5 * sd else None)


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
    c.passed()
    c.rule = before


OPTIONS = dict(qkv_bias=False, drop=0.5, attn_drop=0.5, drop_path=0.5, init_values=0.1)  # in the constructor's order
SHOWN = ", ".join(f"{k}={v}" for k, v in OPTIONS.items())


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
            ("norm", BLOCK_LN1),
            ("attn", "the attention is `attn`, a MultiHeadAttention with `qkv` and `proj`"),
            ("mlp", "the MLP is `mlp`, with `fc1` and `fc2` (hidden width int(dim * mlp_ratio))")])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"EncoderBlock({dim}, {heads}, {ratio})"
        with torch.no_grad():
            c.close(c.call(model, x, label=label), reference(x), "output",
                    twins(c.slips("output", "mask"), reference, (dim, heads, ratio), x), atol=1e-4)
            c.phase("mask")
            mask = random_mask((n, n), g)
            c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                    twins(c.slips("output", "mask"), reference, (dim, heads, ratio), x, mask=mask), atol=1e-4)
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
        ("qkv.bias", BLOCK_QKV_BIAS),
        ("ls", NO_LAYERSCALE)],
        rule="options")
    x = torch.randn(3, 5, 8, generator=g)
    label = f"EncoderBlock(8, 2, 2.0, {SHOWN})"
    with torch.no_grad():
        got = c.call(model, x, label=f"{label} in eval mode")
        c.ok(torch.equal(c.tensor(got, "output in eval mode", x.shape), c.call(model, x, label=label)),
             "in eval mode two calls on the same input gave different outputs", EVAL_RANDOM)
        c.close(got, reference(x), f"output in eval mode with {SHOWN}",
                twins(c.slips("options"), reference, (8, 2, 2.0, *OPTIONS.values()), x), atol=1e-4)


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

        def fits(block):  # (4, b) bool: the sample matches a block wired as ``block`` whose (attention, MLP) branches
            # are (dropped, dropped), (dropped, kept), (kept, dropped), (kept, kept); each drop path made a fixed
            # factor, a LayerScale of all 0 (dropped) or all 2 (kept, scaled by 1/(1-p))
            rows = []
            for a, m in itertools.product((0, 2), (0, 2)):
                twin = block(8, 2, 2.0).eval()
                twin.load_state_dict(reference.state_dict())
                twin.drop_path1, twin.drop_path2 = ref.LayerScale(8, a), ref.LayerScale(8, m)
                rows.append((twin(x) - out).abs().flatten(1).amax(1) < 1e-4)
            return torch.stack(rows)

        c.ok(not torch.allclose(out, reference(x), atol=1e-5), "in training mode with drop_path=0.5 no residual "
             "branch was ever dropped", BLOCK_IGNORED)
        matched = fits(ref.EncoderBlock)
        if not matched.any(0).all():
            wiring = c.diagnose(c.slips("drop_path"), lambda wrong: wrong.any(0).all(), fits)
            c.fail(f"in training mode, {int((~matched.any(0)).sum())} of {len(x)} samples are not x plus each "
                   "residual branch either dropped or kept (and scaled by 1/(1-p) = 2)", wiring or "drop or keep each "
                   "residual branch whole, scaled by 1/(1-p): x = x + drop_path1(ls1(attn(norm1(x)))); x = x + "
                   "drop_path2(ls2(mlp(norm2(x))))")
        c.ok(not matched[-1].all(), "in training mode with drop_path=0.5 no residual branch was ever dropped",
             BLOCK_IGNORED)


def _dropouts(c, cls, g):
    """drop=0.1 and attn_drop=0.3 while training: the attention's weights and proj and the MLP's two places get their
    rates (dropouts made deterministic); both LayerNorms have eps 1e-6."""
    c.phase("eps")
    reference = randomize_norms(ref.EncoderBlock(8, 2, 2.0, drop=0.1, attn_drop=0.3).eval(), g)
    model = c.load(c.build(cls, 8, 2, 2.0, drop=0.1, attn_drop=0.3), reference)
    for name in ("norm1", "norm2"):
        eps = getattr(getattr(model, name, None), "eps", 1e-6)
        c.ok(eps == 1e-6, f"{name}.eps is {eps:g}, the statement's is 1e-6",
             f"{name} = nn.LayerNorm(dim, eps=1e-6): {EPS_DEFAULT}")
    c.phase("dropout")
    x = torch.randn(3, 5, 8, generator=g)
    after = "after the attention's proj (proj_drop=drop) or after the MLP's fc2 (MLP(..., drop=drop))"
    dropout_wiring(c, model, reference, x, "EncoderBlock(8, 2, 2.0, drop=0.1, attn_drop=0.3)", {
        (0.3, (3, 2, 5, 5)): "attn_drop=0.3 on the attention weights (attn_drop=attn_drop)",
        (0.1, (3, 5, 8)): f"drop=0.1 {after}",
        (0.1, (3, 5, 16)): "drop=0.1 in the MLP after GELU (MLP(..., drop=drop))"},
        BLOCK_NO_PROJ_DROP)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "MLP": ("names", "output", "dropout", "gradient"),
    "LayerNorm": ("names", "parameters", "output", "eps", "gradient"),
    "DropPath": ("eval", "training", "error", "p", "gradient"),
    "EncoderBlock": ("names", "output", "mask", "options", "drop_path", "eps", "dropout", "gradient"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
class MLPErf(nn.Module):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)
        self.drop = drop

    def forward(self, x):
        h = self.fc1(x)
        h = F.dropout(0.5 * h * (1 + torch.erf(h / math.sqrt(2))), self.drop, self.training)  # exact GELU
        return F.dropout(self.fc2(h), self.drop, self.training)


class LayerNormRsqrt(ref.LayerNorm):
    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias


class LayerNormF(ref.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class DropPathTimm(ref.DropPath):
    """The statement's constructor, timm's forward (a floored uniform draw as the mask)."""

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        mask = (keep + torch.rand(x.shape[0], *(1,) * (x.ndim - 1), dtype=x.dtype)).floor_()  # timm's trick
        return x.div(keep) * mask


class _MLP(ref.MLP):
    """The reference MLP with one slip, ``slip`` (None: none)."""

    slip = None

    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__(dim, hidden_dim, drop)
        if self.slip == "no_bias":
            self.fc1, self.fc2 = nn.Linear(dim, hidden_dim, bias=False), nn.Linear(hidden_dim, dim, bias=False)
        if self.slip == "names":
            self.linear1, self.linear2 = self.fc1, self.fc2
            del self.fc1, self.fc2
        if self.slip == "one_dropout":  # one module `drop` for both places (the statement names two)
            del self.drop1, self.drop2
            self.drop = nn.Dropout(drop)

    def forward(self, x):
        slip = self.slip
        if slip == "in_place":
            x.clamp_(-3, 3)
        hidden = self.fc1(x).detach() if slip == "detach" else self.fc1(x)
        act = {"relu": F.relu, "tanh": lambda h: F.gelu(h, approximate="tanh"), "no_act": nn.Identity()}.get(
            slip, self.act)
        drop1, drop2 = {"one_dropout": (getattr(self, "drop", None),) * 2, "no_dropout": (nn.Identity(),) * 2,
                        "no_drop2": (self.drop1, nn.Identity()) if slip == "no_drop2" else None,
                        "functional": (lambda h: F.dropout(h, self.drop1.p), lambda h: F.dropout(h, self.drop2.p)),
                        }.get(slip) or (self.drop1, self.drop2)
        if slip == "no_grad":
            with torch.no_grad():
                return drop2(self.fc2(drop1(act(hidden))))
        out = drop2(self.fc2(act(drop1(hidden)) if slip == "drop_before_act" else drop1(act(hidden))))
        out = act(out) if slip == "act_after_fc2" else out
        return x + out if slip == "residual_inside" else out


def _mlp(slip):
    return type("MLP", (_MLP,), {"slip": slip})


class _LayerNorm(ref.LayerNorm):
    """The reference LayerNorm with one slip, ``slip``, or wrong ``knobs`` (unbiased, eps_outside, affine, eps,
    axis)."""

    slip, knobs = None, {}

    def __init__(self, dim, eps=None):
        super().__init__(dim, (1e-5 if self.slip == "torch_default" else 1e-6) if eps is None else eps)
        if self.slip == "eps_parameter":
            self.eps = nn.Parameter(torch.tensor(self.eps))
        if self.slip in ("plain_tensors", "no_parameters"):
            del self.weight, self.bias
        if self.slip == "plain_tensors":
            self.weight, self.bias = torch.ones(dim), torch.zeros(dim)
        if self.slip == "random_start":
            self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        knobs, slip = self.knobs, self.slip
        axis, eps, unbiased = knobs.get("axis", -1), knobs.get("eps", self.eps), knobs.get("unbiased", False)
        axis = tuple(range(x.ndim)) if axis == "all" else axis
        mean = x.mean(axis, keepdim=True)
        mean = mean.detach() if slip == "mean_detached" else mean
        weight = self.weight.data if slip == "weight_data" else self.weight
        var = (x * x).mean(axis, keepdim=True) if knobs.get("raw_var") else x.var(axis, unbiased=unbiased, keepdim=True)
        centred = x.sub_(mean) if slip == "in_place" else x - mean
        y = centred / (var.sqrt() + eps if knobs.get("eps_outside") else torch.sqrt(var + eps))
        return y * weight + self.bias * knobs.get("bias", True) if knobs.get("affine", True) else y


def _layer_norm(slip=None, **knobs):
    return type("LayerNorm", (_LayerNorm,), {"slip": slip, "knobs": knobs})


class _DropPath(DropPathTimm):
    """DropPath with one slip, ``slip`` (None: none)."""

    slip = None

    def __init__(self, p=0.0):
        nn.Module.__init__(self) if self.slip == "no_check" else super().__init__(p)
        self.p = p
        if self.slip == "drop_prob":  # p kept as `drop_prob`: the given extra_repr, which reads self.p, raises
            self.drop_prob = p
            del self.p

    def forward(self, x):
        slip, p = self.slip, self.drop_prob if self.slip == "drop_prob" else self.p
        if p == 0.0 or not (self.training or slip == "in_eval"):
            return x
        keep = p if slip == "keep_is_p" else 1 - p
        shape = {"elementwise": x.shape, "mask_3d": (x.shape[0], 1, 1), "one_coin": ()}.get(
            slip, (x.shape[0],) + (1,) * (x.ndim - 1))
        mask = (torch.rand(shape) < keep).to(x.dtype) * {"not_scaled": 1.0, "times_keep": 1 - p}.get(slip, 1 / (1 - p))
        return x.mul_(mask) if slip == "mul_" else (x.detach() if slip == "detach" else x) * mask


def _droppath(slip=None):
    return type("DropPath", (_DropPath,), {"slip": slip})


class BlockOwnParts(nn.Module):
    """A block from the learner's own parts (torch's LayerNorm with the statement's eps, timm-style DropPath)."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.mlp = ref.MLP(dim, int(dim * mlp_ratio), drop)
        self.ls1, self.ls2 = (ref.LayerScale(dim, init_values) if init_values else nn.Identity() for _ in range(2))
        self.drop_path1, self.drop_path2 = (DropPathTimm(drop_path) for _ in range(2))

    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class _Block(ref.EncoderBlock):
    """The reference block with one slip, ``slip`` (None: none)."""

    slip = None

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        ignored = {"qkv_bias": dict(qkv_bias=True), "init_values": dict(init_values=None),
                   "drop_path": dict(drop_path=0.0)}.get(self.slip, {})
        options = dict(qkv_bias=qkv_bias, drop=drop, attn_drop=attn_drop, drop_path=drop_path,
                       init_values=init_values) | ignored
        super().__init__(dim, num_heads, mlp_ratio, **options)
        self.rate = drop_path
        if self.slip == "eps":
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if self.slip in ("proj_drop", "attn_drop"):
            self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, **{
                "proj_drop": dict(attn_drop=attn_drop), "attn_drop": dict(proj_drop=drop)}[self.slip])
        if self.slip == "mlp_drop":
            self.mlp = ref.MLP(dim, int(dim * mlp_ratio))
        if self.slip == "ln1":
            self.ln1 = self.norm1
            del self.norm1

    def forward(self, x, mask=None):
        slip = self.slip
        attn = lambda y: self.attn(y, mask=None if slip == "nomask" else mask)  # noqa: E731
        norm1, norm2, mlp = self.ln1 if slip == "ln1" else self.norm1, self.norm2, self.mlp
        ls1, ls2 = {"swap_ls": (self.ls2, self.ls1), "no_ls": (nn.Identity(), nn.Identity())}.get(
            slip, (self.ls1, self.ls2))
        wired = {  # the wrong wirings: (the attention's update, then the MLP's), each a function of the x it is given
            "post": (lambda y: norm1(y + attn(y)), lambda y: norm2(y + mlp(y))),
            "shared": (lambda y: y + attn(norm1(y)), lambda y: y + mlp(norm1(y))),
            "nores": (lambda y: attn(norm1(y)), lambda y: y + mlp(norm2(y))),
            "norm_in_residual": (lambda y: norm1(y) + attn(norm1(y)), lambda y: norm2(y) + mlp(norm2(y))),
            "mlp_first": (lambda y: y + mlp(norm2(y)), lambda y: y + attn(norm1(y))),
            "residual_normalised": (lambda y: norm1(y) + attn(norm1(y)), lambda y: y + mlp(norm2(y))),
            "no_mlp_residual": (lambda y: y + attn(norm1(y)), lambda y: mlp(norm2(y))),
            "no_residuals": (lambda y: attn(norm1(y)), lambda y: mlp(norm2(y))),
            "mlp_unnormalised": (lambda y: y + attn(norm1(y)), lambda y: y + mlp(y)),
            "around_sum": (lambda y: self.drop_path1(y + ls1(attn(norm1(y)))),
                           lambda y: self.drop_path2(y + ls2(mlp(norm2(y))))),
        }
        if slip in wired:
            first, second = wired[slip]
            return second(first(x))
        if slip == "parallel":  # both branches read the block's input
            return x + attn(norm1(x)) + mlp(norm2(x))
        if slip == "eval_drop_path":
            keep = (torch.rand(len(x), 1, 1) >= self.rate) / (1 - self.rate) if self.rate else 1.0
            x = x + keep * attn(norm1(x))
            return x + mlp(norm2(x))
        with torch.no_grad() if slip == "attn_no_grad" else contextlib.nullcontext():
            branch = attn(norm1(x))
        if slip == "in_place":
            x += self.drop_path1(ls1(branch))
        else:
            x = (x.detach() if slip == "residual_detached" else x) + self.drop_path1(ls1(branch))
        return x + self.drop_path2(ls2(mlp(norm2(x))))


def _block(slip):
    return type("EncoderBlock", (_Block,), {"slip": slip})


SLIPS = [Slip("MLP", name, rule, hint, impl) for name, rule, hint, impl in [
    ("names", "names", BLOCK_NAMES, _mlp("names")),
    ("no_bias", "names", BLOCK_NO_BIAS, _mlp("no_bias")),
    ("relu", "output", "this is the MLP with ReLU: ViT uses the exact GELU, nn.GELU()", _mlp("relu")),
    ("tanh", "output", "this is the MLP with the tanh approximation of GELU: use the exact one, nn.GELU() "
     "(approximate='none')", _mlp("tanh")),
    ("no_activation", "output", "there is no activation between fc1 and fc2: add nn.GELU()", _mlp("no_act")),
    ("residual_inside", "output", "the input is added to the MLP's output: the residual belongs to the encoder block, "
     "the MLP returns fc2's output alone", _mlp("residual_inside")),
    ("act_after_fc2", "output", "the activation is applied after fc2 as well (or only there): it goes between fc1 "
     "and fc2", _mlp("act_after_fc2")),
    ("functional", "dropout", MLP_EVAL, _mlp("functional")),
    ("no_dropout", "dropout", MLP_TRAIN, _mlp("no_dropout")),
    ("no_drop2", "dropout", BLOCK_NO_DROP2, _mlp("no_drop2")),
    ("drop_before_act", "dropout", BLOCK_NO_DROP2, _mlp("drop_before_act")),
    ("one_dropout", "dropout", BLOCK_ONE_DROPOUT, _mlp("one_dropout")),
    ("detach", "gradient", CUT_AT, _mlp("detach")),
    ("no_grad", "gradient", CUT_AT, _mlp("no_grad")),
    ("clamp_", "inputs", IN_PLACE, _mlp("in_place")),
]]
SLIPS += [Slip("LayerNorm", name, rule, hint, impl) for name, rule, hint, impl in [
    ("eps_parameter", "names", BLOCK_EPS_PARAMETER, _layer_norm("eps_parameter")),
    ("plain_tensors", "parameters", PLAIN_TENSOR, _layer_norm("plain_tensors")),
    ("no_parameters", "parameters", PLAIN_TENSOR, _layer_norm("no_parameters")),
    ("random_start", "parameters", NEW_NORM, _layer_norm("random_start")),
    ("unbiased", "output", "this uses the unbiased variance (divides by dim - 1): LayerNorm uses the biased one, "
     "`x.var(-1, unbiased=False)`", _layer_norm(unbiased=True)),
    ("eps_outside", "output", "eps is added to the standard deviation: it belongs inside the square root, sqrt(var + "
     "eps)", _layer_norm(eps_outside=True)),
    ("not_affine", "output", "weight and bias are not applied: scale by `weight` and shift by `bias` at the end",
     _layer_norm(affine=False)),
    ("eps_ignored", "output", "eps seems ignored or hard-coded: use the eps given to the constructor",
     _layer_norm(eps=1e-5)),
    ("axis", "output", "the mean and variance are taken over the wrong axis: normalise each token over its own "
     "features, the last axis", _layer_norm(axis=0)),
    ("whole_tensor", "output", "the mean and variance are taken over the whole tensor: normalise each token over "
     "its own features, x.mean(-1, keepdim=True)", _layer_norm(axis="all")),
    ("no_bias", "output", "the bias is not added: scale by `weight`, then shift by `bias`", _layer_norm(bias=False)),
    ("mean_of_squares", "output", "the variance is the mean of x squared, E[x^2]: take it of the centred x, "
     "((x - mean) ** 2).mean(-1), or x.var(-1, unbiased=False)", _layer_norm(raw_var=True)),
    ("torch_default", "eps", "the default eps is not 1e-6: write the signature LayerNorm(dim, eps=1e-6) (ViT's and "
     "timm's value; PyTorch's default is 1e-5)", _layer_norm("torch_default")),
    ("mean_detached", "gradient", CUT_AT, _layer_norm("mean_detached")),
    ("weight_data", "gradient", CUT_AT, _layer_norm("weight_data")),
    ("x_minus_mean", "inputs", IN_PLACE, _layer_norm("in_place")),
]]
SLIPS += [Slip("DropPath", name, rule, hint, _droppath(name)) for name, rule, hint in [
    ("in_eval", "eval", BLOCK_IN_EVAL),
    ("elementwise", "training", BLOCK_ELEMENTWISE),
    ("one_coin", "training", BLOCK_ONE_COIN),
    ("not_scaled", "training", UNBIASED),
    ("times_keep", "training", NO_MULTIPLY),
    ("keep_is_p", "training", KEEP_IS_P),
    ("mask_3d", "training", BLOCK_MASK_3D),
    ("no_check", "error", BLOCK_NO_CHECK),
    ("detach", "gradient", CUT_AT),
    ("mul_", "inputs", IN_PLACE),
    ("drop_prob", "p", BLOCK_DROP_PROB),
]]
SLIPS += [Slip("EncoderBlock", name, rule, hint, impl) for name, rule, hint, impl in [
    ("ln1", "names", BLOCK_LN1, _block("ln1")),
    ("post_norm", "output", "this is a post-norm block (norm after the residual sum): ViT normalises first, x = x + "
     "attn(norm1(x)); x = x + mlp(norm2(x))", _block("post")),
    ("no_residual", "output", "the residual connection around attention is missing: x = x + attn(norm1(x))",
     _block("nores")),
    ("parallel", "output", "both branches read the same x (a parallel block): the MLP reads the x updated by "
     "attention, x = x + attn(norm1(x)); x = x + mlp(norm2(x))", _block("parallel")),
    ("no_mask", "mask", "the mask seems not to reach the attention: pass it on, self.attn(..., mask=mask)",
     _block("nomask")),
    ("qkv_bias", "options", BLOCK_QKV_BIAS, _block("qkv_bias")),
    ("swap_ls", "options", "ls1 and ls2 are swapped: ls1 scales the attention branch, ls2 the MLP branch",
     _block("swap_ls")),
    ("around_sum", "drop_path", "DropPath is applied to x + branch: it goes on the residual branch alone, x = x + "
     "drop_path1(ls1(attn(norm1(x))))", _block("around_sum")),
    ("ignored", "drop_path", BLOCK_IGNORED, _block("drop_path")),
    ("residual_detached", "gradient", CUT_AT, _block("residual_detached")),
    ("attn_no_grad", "gradient", CUT_AT, _block("attn_no_grad")),
    ("plus_equals", "inputs", IN_PLACE, _block("in_place")),
    ("torch_default", "eps", EPS_DEFAULT, _block("eps")),
    ("no_proj_drop", "dropout", BLOCK_NO_PROJ_DROP, _block("proj_drop")),
    ("no_attn_drop", "dropout", BLOCK_NO_PROJ_DROP, _block("attn_drop")),
    ("mlp_without_drop", "dropout", BLOCK_NO_PROJ_DROP, _block("mlp_drop")),
    ("shared_norm", "output", "the same LayerNorm is used twice: the block has two, norm1 before attention and norm2 "
     "before the MLP", _block("shared")),
    ("norm_in_residual", "output", "the residual adds the normalised x: add the branch to x itself, x = x + "
     "attn(norm1(x))", _block("norm_in_residual")),
    ("no_mlp_residual", "output", "the residual connection around the MLP is missing: x = x + mlp(norm2(x))",
     _block("no_mlp_residual")),
    ("no_residuals", "output", "both residual connections are missing: x = x + attn(norm1(x)); x = x + "
     "mlp(norm2(x))", _block("no_residuals")),
    ("mlp_first", "output", "the MLP comes before attention: attention first, then the MLP", _block("mlp_first")),
    ("residual_normalised", "output", "the residual stream is the normalised x: normalise only the branch's input, "
     "x = x + attn(norm1(x))", _block("residual_normalised")),
    ("mlp_unnormalised", "output", "the MLP reads x without its LayerNorm: x = x + mlp(norm2(x))",
     _block("mlp_unnormalised")),
    ("no_layerscale", "options", NO_LAYERSCALE, _block("init_values")),
    ("ls_not_applied", "options", "LayerScale is not applied: x = x + drop_path1(ls1(attn(norm1(x)))), and ls2 on the "
     "MLP branch", _block("no_ls")),
    ("eval_random", "options", EVAL_RANDOM, _block("eval_drop_path")),
]]


VARIANTS = [Variant(exercise, name, impl) for exercise, name, impl in [
    ("MLP", "reference", ref.MLP),
    ("MLP", "erf", MLPErf),
    ("MLP", "knobs", _mlp(None)),
    ("LayerNorm", "reference", ref.LayerNorm),
    ("LayerNorm", "rsqrt", LayerNormRsqrt),
    ("LayerNorm", "functional", LayerNormF),
    ("LayerNorm", "knobs", _layer_norm()),
    ("DropPath", "reference", ref.DropPath),
    ("DropPath", "timm", DropPathTimm),
    ("DropPath", "knobs", _droppath()),
    ("EncoderBlock", "reference", ref.EncoderBlock),
    ("EncoderBlock", "own_parts", BlockOwnParts),
    ("EncoderBlock", "knobs", _block(None)),
]]
