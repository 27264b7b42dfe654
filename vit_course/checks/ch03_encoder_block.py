"""Chapter 03's exercises: MLP, LayerNorm, DropPath and their assembly EncoderBlock (pre-norm residuals, the given
options applied, drop path while training, equal to PyTorch's pre-norm nn.TransformerEncoderLayer): checks and rules.
Each slip of the catalogue is a wrong solution written out whole, named after its mistake."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

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
BLOCK_DROP_PROB = "keep the probability as self.p = p: the given extra_repr reads it"
BLOCK_LN1 = "two LayerNorms, norm1 (before attention) and norm2 (before the MLP)"
BLOCK_QKV_BIAS = "qkv_bias=False seems ignored: pass it on, MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, ...)"
BLOCK_IGNORED = ("drop_path seems ignored: the given drop_path1 and drop_path2 go on their branches, x = x + "
                 "drop_path1(ls1(attn(norm1(x)))) and the same with drop_path2 on the MLP's")
BLOCK_NO_PROJ_DROP = ("pass the rates on: MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, "
                      "proj_drop=drop) and MLP(dim, int(dim * mlp_ratio), drop=drop)")
KEEP_IS_P = "p is the probability to drop (bernoulli of 1 - p keeps)"
NO_LAYERSCALE = ("with init_values set, ls1 and ls2 are LayerScale(dim, init_values); without, nn.Identity() (the "
                 "given lines at the top of __init__)")
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
LN_WRONG_AXIS = ("normalise each token over its own features, the last axis: x.mean(-1, keepdim=True) and "
                 "x.var(-1, unbiased=False, keepdim=True)")
LN_SPREAD = "divide the centred x by the standard deviation, sqrt(var + eps)"
LS_WIRING = "ls1 scales the attention branch, ls2 the MLP branch, each once"
TORCH_LAYER = ("nn.TransformerEncoderLayer(dim, num_heads, int(dim * mlp_ratio), dropout=0.0, activation='gelu', "
               "batch_first=True, norm_first=True, layer_norm_eps=1e-6)")
TORCH_NAMES = {  # timm's name (ours) -> PyTorch's
    "norm1.weight": "norm1.weight", "norm1.bias": "norm1.bias",
    "attn.qkv.weight": "self_attn.in_proj_weight", "attn.qkv.bias": "self_attn.in_proj_bias",
    "attn.proj.weight": "self_attn.out_proj.weight", "attn.proj.bias": "self_attn.out_proj.bias",
    "norm2.weight": "norm2.weight", "norm2.bias": "norm2.bias",
    "mlp.fc1.weight": "linear1.weight", "mlp.fc1.bias": "linear1.bias",
    "mlp.fc2.weight": "linear2.weight", "mlp.fc2.bias": "linear2.bias",
}


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
    """DropPath(p): eval mode or p = 0: identity; in training, zero whole samples of
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
    with PyTorch's pre-norm nn.TransformerEncoderLayer's weights copied in, the same output, with and without a mask;
    gradients reach x and every parameter."""
    g = torch.Generator().manual_seed(9)
    for dim, heads, ratio, batch, n in ((12, 3, 2.0, 2, 7), (8, 2, 4.0, 1, 5), (6, 1, 1.5, 3, 4)):
        reference, layer = _torch_pair(dim, heads, ratio, g)
        model = c.build(cls, dim, heads, ratio)
        c.load(model, reference, [
            ("norm", BLOCK_LN1),
            ("attn", "the attention is `attn`, a MultiHeadAttention with `qkv` and `proj`"),
            ("mlp", "the MLP is `mlp`, with `fc1` and `fc2` (hidden width int(dim * mlp_ratio))")])
        x = torch.randn(batch, n, dim, generator=g)
        label = f"EncoderBlock({dim}, {heads}, {ratio})"
        torch_layer = TORCH_LAYER.replace("dim, num_heads, int(dim * mlp_ratio)", f"{dim}, {heads}, {int(dim * ratio)}")
        with torch.no_grad():
            c.close(c.call(model, x, label=label), layer(x), f"output (against PyTorch's {torch_layer} with the same "
                    "weights)", twins(c.slips("output", "mask"), reference, (dim, heads, ratio), x), atol=1e-4)
            c.phase("mask")
            mask = random_mask((n, n), g)
            c.close(c.call(model, x, mask=mask, label=label), layer(x, src_mask=~mask), "output with a mask (against "
                    "PyTorch's layer given src_mask=~mask, its True meaning blocked)",
                    twins(c.slips("output", "mask"), reference, (dim, heads, ratio), x, mask=mask), atol=1e-4)
            c.phase("output")
        gradient_flow(c, cls, lambda t: c.call(model, t["x"], label=label), lambda t: reference(t["x"]),
                      dict(x=x), model, reference)
    _options(c, cls, g)
    _drop_path(c, cls, g)
    _dropouts(c, cls, g)


def _torch_pair(dim, heads, ratio, g):
    """The reference block (random LayerNorms, so a swapped or shared norm shows) and PyTorch's pre-norm encoder layer
    holding the same weights, both in eval mode."""
    reference = randomize_norms(ref.EncoderBlock(dim, heads, ratio).eval(), g)
    layer = nn.TransformerEncoderLayer(dim, heads, int(dim * ratio), dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True, layer_norm_eps=1e-6).eval()
    state = reference.state_dict()
    layer.load_state_dict({theirs: state[ours] for ours, theirs in TORCH_NAMES.items()})
    return reference, layer


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
    "DropPath": ("eval", "training", "p", "gradient"),
    "EncoderBlock": ("names", "output", "mask", "options", "drop_path", "eps", "dropout", "gradient"),
}


# ---- the catalogue: each slip once, a wrong solution written out whole and named after its mistake, with the rule
# it breaks and the hint it earns; then the accepted variants


# MLP: the statement's constructor unless the slip is in it
class _MLPParts(nn.Module):
    """The statement's MLP constructor: fc1, exact GELU, drop1, fc2, drop2."""

    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)


class MLPNamedLinear1Linear2(nn.Module):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden_dim)  # PyTorch's names, not timm's fc1 and fc2
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.linear2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.linear2(self.drop1(self.act(self.linear1(x)))))


class MLPWithoutBias(_MLPParts):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__(dim, hidden_dim, drop)
        self.fc1 = nn.Linear(dim, hidden_dim, bias=False)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class MLPWithReLU(_MLPParts):
    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(F.relu(self.fc1(x)))))


class MLPWithTanhGELU(_MLPParts):
    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(F.gelu(self.fc1(x), approximate="tanh"))))


class MLPWithoutActivation(_MLPParts):
    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.fc1(x))))


class MLPWithResidual(_MLPParts):
    def forward(self, x):
        return x + self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class MLPActivationAfterFc2(_MLPParts):
    def forward(self, x):
        return self.act(self.drop2(self.fc2(self.drop1(self.act(self.fc1(x))))))


class MLPFunctionalDropout(_MLPParts):
    def forward(self, x):
        h = F.dropout(self.act(self.fc1(x)), self.drop1.p)  # F.dropout's training=True: on in eval mode too
        return F.dropout(self.fc2(h), self.drop2.p)


class MLPWithoutDropout(_MLPParts):
    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MLPWithoutDrop2(_MLPParts):
    def forward(self, x):
        return self.fc2(self.drop1(self.act(self.fc1(x))))


class MLPDropoutBeforeActivation(_MLPParts):
    def forward(self, x):
        return self.drop2(self.fc2(self.act(self.drop1(self.fc1(x)))))


class MLPOneDropout(nn.Module):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)  # one module for both places

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class MLPHiddenDetached(_MLPParts):
    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x).detach()))))


class MLPNoGrad(_MLPParts):
    def forward(self, x):
        with torch.no_grad():
            return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class MLPClampsInputInPlace(_MLPParts):
    def forward(self, x):
        x.clamp_(-3, 3)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


# LayerNorm: the statement's constructor unless the slip is in it
class _LayerNormParts(nn.Module):
    """The statement's LayerNorm constructor: eps, weight (ones) and bias (zeros)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))


class LayerNormEpsParameter(_LayerNormParts):
    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)
        self.eps = nn.Parameter(torch.tensor(eps))  # a third, learned parameter

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormPlainTensors(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.ones(dim)  # not nn.Parameter
        self.bias = torch.zeros(dim)

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormWithoutParameters(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps)


class LayerNormRandomStart(_LayerNormParts):
    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormUnbiased(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)  # divides by dim - 1
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormEpsOutsideSqrt(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / (torch.sqrt(var) + self.eps) * self.weight + self.bias


class LayerNormNotAffine(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps)


class LayerNormFixedEps(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class LayerNormOverBatch(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(0, keepdim=True), x.var(0, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormOverTokens(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-2, keepdim=True), x.var(-2, unbiased=False, keepdim=True)  # across the tokens
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormOverTokensAndFeatures(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean((-2, -1), keepdim=True), x.var((-2, -1), unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormOverWholeTensor(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(), x.var(unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormWithoutBias(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight


class LayerNormMeanOfSquares(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), (x * x).mean(-1, keepdim=True)  # E[x^2], not centred
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormDividedByVariance(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / (var + self.eps) * self.weight + self.bias  # no square root


class LayerNormDividedBySqrtStd(_LayerNormParts):
    def forward(self, x):
        mean, std = x.mean(-1, keepdim=True), x.std(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(std + self.eps) * self.weight + self.bias  # the root of the std


class LayerNormOnlyCentred(_LayerNormParts):
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) * self.weight + self.bias


class LayerNormTorchDefault(_LayerNormParts):
    def __init__(self, dim, eps=1e-5):  # PyTorch's default
        super().__init__(dim, eps)

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormMeanDetached(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True).detach(), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormWeightData(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight.data + self.bias


class LayerNormCentresInPlace(_LayerNormParts):
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return x.sub_(mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


# DropPath: the statement's constructor (keep p as self.p) unless the slip is in it
class _DropPathParts(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.p = p

    def extra_repr(self):
        return f"p={self.p}"


class DropPathInEval(_DropPathParts):
    def forward(self, x):
        if self.p == 0.0:  # no `not self.training`: on in eval mode too
            return x
        mask = (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.p).to(x.dtype)
        return x * mask / (1 - self.p)


class DropPathElementwise(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(x.shape) < 1 - self.p).to(x.dtype)  # a coin per element: dropout
        return x * mask / (1 - self.p)


class DropPathOneCoin(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(()) < 1 - self.p).to(x.dtype)  # one coin for the whole batch
        return x * mask / (1 - self.p)


class DropPathNotScaled(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return x * (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.p).to(x.dtype)


class DropPathTimesKeep(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.p).to(x.dtype)
        return x * mask * (1 - self.p)


class DropPathKeepsWithP(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < self.p).to(x.dtype)  # keeps with probability p
        return x * mask / (1 - self.p)


class DropPathMask3D(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(x.shape[0], 1, 1) < 1 - self.p).to(x.dtype)  # right for (b, n, D) only
        return x * mask / (1 - self.p)


class DropPathDetached(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.p).to(x.dtype)
        return x.detach() * mask / (1 - self.p)


class DropPathMultipliesInPlace(_DropPathParts):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        mask = (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.p).to(x.dtype)
        return x.mul_(mask / (1 - self.p))


class DropPathNamedDropProb(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.drop_prob = p  # the given extra_repr reads self.p

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        if not self.training or self.drop_prob == 0.0:
            return x
        mask = (torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.drop_prob).to(x.dtype)
        return x * mask / (1 - self.drop_prob)


# EncoderBlock: the statement's constructor (the given options, then norm1, attn, norm2, mlp) unless the slip is in it
class _BlockParts(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        super().__init__()
        self.ls1 = ref.LayerScale(dim, init_values) if init_values else nn.Identity()
        self.ls2 = ref.LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = ref.DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.drop_path2 = ref.DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ref.MLP(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x, mask=None):  # the statement's wiring; a slip overrides it
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockNamedLn1(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, **options):
        super().__init__(dim, num_heads, mlp_ratio, **options)
        self.ln1, self.ln2 = self.norm1, self.norm2  # not timm's names
        del self.norm1, self.norm2

    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.ln1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.ln2(x))))


class EncoderBlockIgnoresQkvBias(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, **options):
        super().__init__(dim, num_heads, mlp_ratio, **options)  # qkv_bias not passed on: always True


class EncoderBlockTorchDefaultEps(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, **options):
        super().__init__(dim, num_heads, mlp_ratio, **options)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)  # eps 1e-5


class EncoderBlockWithoutProjDrop(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, **options):
        super().__init__(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, **options)
        self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop)


class EncoderBlockWithoutAttnDrop(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, **options):
        super().__init__(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, **options)
        self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, proj_drop=drop)


class EncoderBlockMLPWithoutDrop(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, **options):
        super().__init__(dim, num_heads, mlp_ratio, qkv_bias, drop, **options)
        self.mlp = ref.MLP(dim, int(dim * mlp_ratio))


class EncoderBlockPostNorm(_BlockParts):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop_path1(self.ls1(self.attn(x, mask=mask))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))


class EncoderBlockWithoutAttentionResidual(_BlockParts):
    def forward(self, x, mask=None):
        x = self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockWithoutMLPResidual(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockWithoutResiduals(_BlockParts):
    def forward(self, x, mask=None):
        x = self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockParallel(_BlockParts):
    def forward(self, x, mask=None):  # both branches read the block's input
        return x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask))) + \
            self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockSharedNorm(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm1(x))))  # norm1 again


class EncoderBlockAddsNormalisedX(_BlockParts):
    def forward(self, x, mask=None):
        h = self.norm1(x)
        x = h + self.drop_path1(self.ls1(self.attn(h, mask=mask)))
        h = self.norm2(x)
        return h + self.drop_path2(self.ls2(self.mlp(h)))


class EncoderBlockNormalisedStream(_BlockParts):
    def forward(self, x, mask=None):
        x = self.norm1(x)  # the stream itself normalised, once
        x = x + self.drop_path1(self.ls1(self.attn(x, mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockMLPFirst(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))


class EncoderBlockMLPUnnormalised(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(x)))


class EncoderBlockMaskDropped(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))  # mask not passed on
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockLayerScalesSwapped(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls2(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls1(self.mlp(self.norm2(x))))


class EncoderBlockLs1Twice(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls1(self.mlp(self.norm2(x))))  # ls1 reused: ls2 is never applied


class EncoderBlockLs2Twice(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls2(self.attn(self.norm1(x), mask=mask)))  # ls2 on the attention branch too
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockWithoutLayerScale(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.attn(self.norm1(x), mask=mask))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class EncoderBlockMLPUnscaled(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))  # ls2 forgotten


class EncoderBlockOwnDropPath(_BlockParts):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, drop_path=0.0, **options):
        super().__init__(dim, num_heads, mlp_ratio, drop_path=drop_path, **options)
        self.rate = drop_path

    def forward(self, x, mask=None):  # a coin drawn in forward, whatever the mode
        keep = (torch.rand(len(x), 1, 1) >= self.rate).to(x.dtype) / (1 - self.rate) if self.rate else 1.0
        x = x + keep * self.ls1(self.attn(self.norm1(x), mask=mask))
        return x + self.ls2(self.mlp(self.norm2(x)))


class EncoderBlockDropPathAroundSum(_BlockParts):
    def forward(self, x, mask=None):
        x = self.drop_path1(x + self.ls1(self.attn(self.norm1(x), mask=mask)))
        return self.drop_path2(x + self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockWithoutDropPath(_BlockParts):
    def forward(self, x, mask=None):
        x = x + self.ls1(self.attn(self.norm1(x), mask=mask))
        return x + self.ls2(self.mlp(self.norm2(x)))


class EncoderBlockResidualDetached(_BlockParts):
    def forward(self, x, mask=None):
        x = x.detach() + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockAttentionNoGrad(_BlockParts):
    def forward(self, x, mask=None):
        with torch.no_grad():
            branch = self.attn(self.norm1(x), mask=mask)
        x = x + self.drop_path1(self.ls1(branch))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class EncoderBlockPlusEquals(_BlockParts):
    def forward(self, x, mask=None):
        x += self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))  # changes the caller's tensor
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


SLIPS = [Slip("MLP", name, rule, hint, impl) for name, rule, hint, impl in [
    ("names", "names", BLOCK_NAMES, MLPNamedLinear1Linear2),
    ("no_bias", "names", BLOCK_NO_BIAS, MLPWithoutBias),
    ("relu", "output", "this is the MLP with ReLU: ViT uses the exact GELU, nn.GELU()", MLPWithReLU),
    ("tanh", "output", "this is the MLP with the tanh approximation of GELU: use the exact one, nn.GELU() "
     "(approximate='none')", MLPWithTanhGELU),
    ("no_activation", "output", "there is no activation between fc1 and fc2: add nn.GELU()", MLPWithoutActivation),
    ("residual_inside", "output", "the input is added to the MLP's output: the residual belongs to the encoder block, "
     "the MLP returns fc2's output alone", MLPWithResidual),
    ("act_after_fc2", "output", "the activation is applied after fc2 as well (or only there): it goes between fc1 "
     "and fc2", MLPActivationAfterFc2),
    ("functional", "dropout", MLP_EVAL, MLPFunctionalDropout),
    ("no_dropout", "dropout", MLP_TRAIN, MLPWithoutDropout),
    ("no_drop2", "dropout", BLOCK_NO_DROP2, MLPWithoutDrop2),
    ("drop_before_act", "dropout", BLOCK_NO_DROP2, MLPDropoutBeforeActivation),
    ("one_dropout", "dropout", BLOCK_ONE_DROPOUT, MLPOneDropout),
    ("detach", "gradient", CUT_AT, MLPHiddenDetached),
    ("no_grad", "gradient", CUT_AT, MLPNoGrad),
    ("clamp_", "inputs", IN_PLACE, MLPClampsInputInPlace),
]]
SLIPS += [Slip("LayerNorm", name, rule, hint, impl) for name, rule, hint, impl in [
    ("eps_parameter", "names", BLOCK_EPS_PARAMETER, LayerNormEpsParameter),
    ("plain_tensors", "parameters", PLAIN_TENSOR, LayerNormPlainTensors),
    ("no_parameters", "parameters", PLAIN_TENSOR, LayerNormWithoutParameters),
    ("random_start", "parameters", NEW_NORM, LayerNormRandomStart),
    ("unbiased", "output", "this uses the unbiased variance (divides by dim - 1): LayerNorm uses the biased one, "
     "`x.var(-1, unbiased=False)`", LayerNormUnbiased),
    ("eps_outside", "output", "eps is added to the standard deviation: it belongs inside the square root, sqrt(var + "
     "eps)", LayerNormEpsOutsideSqrt),
    ("not_affine", "output", "weight and bias are not applied: scale by `weight` and shift by `bias` at the end",
     LayerNormNotAffine),
    ("eps_ignored", "output", "eps seems ignored or hard-coded: use the eps given to the constructor",
     LayerNormFixedEps),
    ("over_batch", "output", f"the mean and variance are taken over the batch axis (axis 0), across samples: "
     f"{LN_WRONG_AXIS}", LayerNormOverBatch),
    ("over_tokens", "output", f"the mean and variance are taken over the token axis (-2), across the tokens: "
     f"{LN_WRONG_AXIS}", LayerNormOverTokens),
    ("over_tokens_and_features", "output", "the mean and variance are taken over a whole sequence, tokens and features "
     f"together: {LN_WRONG_AXIS}", LayerNormOverTokensAndFeatures),
    ("whole_tensor", "output", f"the mean and variance are taken over the whole tensor: {LN_WRONG_AXIS}",
     LayerNormOverWholeTensor),
    ("no_bias", "output", "the bias is not added: scale by `weight`, then shift by `bias`", LayerNormWithoutBias),
    ("mean_of_squares", "output", "the variance is the mean of x squared, E[x^2]: take it of the centred x, "
     "((x - mean) ** 2).mean(-1), or x.var(-1, unbiased=False)", LayerNormMeanOfSquares),
    ("by_variance", "output", f"this divides by the variance, var + eps, not its square root: {LN_SPREAD}",
     LayerNormDividedByVariance),
    ("by_sqrt_std", "output", "this divides by the square root of the standard deviation (a square root taken twice, "
     f"or sqrt of x.std()): {LN_SPREAD}, or x.std(-1, unbiased=False) itself", LayerNormDividedBySqrtStd),
    ("only_centred", "output", f"x is centred but not divided by its spread: {LN_SPREAD}", LayerNormOnlyCentred),
    ("torch_default", "eps", "the default eps is not 1e-6: write the signature LayerNorm(dim, eps=1e-6) (ViT's and "
     "timm's value; PyTorch's default is 1e-5)", LayerNormTorchDefault),
    ("mean_detached", "gradient", CUT_AT, LayerNormMeanDetached),
    ("weight_data", "gradient", CUT_AT, LayerNormWeightData),
    ("x_minus_mean", "inputs", IN_PLACE, LayerNormCentresInPlace),
]]
SLIPS += [Slip("DropPath", name, rule, hint, impl) for name, rule, hint, impl in [
    ("in_eval", "eval", BLOCK_IN_EVAL, DropPathInEval),
    ("elementwise", "training", BLOCK_ELEMENTWISE, DropPathElementwise),
    ("one_coin", "training", BLOCK_ONE_COIN, DropPathOneCoin),
    ("not_scaled", "training", UNBIASED, DropPathNotScaled),
    ("times_keep", "training", NO_MULTIPLY, DropPathTimesKeep),
    ("keep_is_p", "training", KEEP_IS_P, DropPathKeepsWithP),
    ("mask_3d", "training", BLOCK_MASK_3D, DropPathMask3D),
    ("detach", "gradient", CUT_AT, DropPathDetached),
    ("mul_", "inputs", IN_PLACE, DropPathMultipliesInPlace),
    ("drop_prob", "p", BLOCK_DROP_PROB, DropPathNamedDropProb),
]]
SLIPS += [Slip("EncoderBlock", name, rule, hint, impl) for name, rule, hint, impl in [
    ("ln1", "names", BLOCK_LN1, EncoderBlockNamedLn1),
    ("post_norm", "output", "this is a post-norm block (norm after the residual sum): ViT normalises first, x = x + "
     "attn(norm1(x)); x = x + mlp(norm2(x))", EncoderBlockPostNorm),
    ("no_residual", "output", "the residual connection around attention is missing: x = x + attn(norm1(x))",
     EncoderBlockWithoutAttentionResidual),
    ("parallel", "output", "both branches read the same x (a parallel block): the MLP reads the x updated by "
     "attention, x = x + attn(norm1(x)); x = x + mlp(norm2(x))", EncoderBlockParallel),
    ("no_mask", "mask", "the mask seems not to reach the attention: pass it on, self.attn(..., mask=mask)",
     EncoderBlockMaskDropped),
    ("qkv_bias", "options", BLOCK_QKV_BIAS, EncoderBlockIgnoresQkvBias),
    ("swap_ls", "options", f"ls1 and ls2 are swapped: {LS_WIRING}", EncoderBlockLayerScalesSwapped),
    ("ls1_twice", "options", f"ls1 is used in the MLP branch too (ls2 is never applied): {LS_WIRING}, "
     "x = x + drop_path2(ls2(mlp(norm2(x))))", EncoderBlockLs1Twice),
    ("ls2_twice", "options", f"ls2 is used in the attention branch too (ls1 is never applied): {LS_WIRING}, "
     "x = x + drop_path1(ls1(attn(norm1(x))))", EncoderBlockLs2Twice),
    ("ls_not_applied", "options", "LayerScale is not applied: x = x + drop_path1(ls1(attn(norm1(x)))), and ls2 on the "
     "MLP branch", EncoderBlockWithoutLayerScale),
    ("mlp_unscaled", "options", "ls2 is not applied to the MLP branch: x = x + drop_path2(ls2(mlp(norm2(x))))",
     EncoderBlockMLPUnscaled),
    ("eval_random", "options", EVAL_RANDOM, EncoderBlockOwnDropPath),
    ("around_sum", "drop_path", "DropPath is applied to x + branch: it goes on the residual branch alone, x = x + "
     "drop_path1(ls1(attn(norm1(x))))", EncoderBlockDropPathAroundSum),
    ("ignored", "drop_path", BLOCK_IGNORED, EncoderBlockWithoutDropPath),
    ("residual_detached", "gradient", CUT_AT, EncoderBlockResidualDetached),
    ("attn_no_grad", "gradient", CUT_AT, EncoderBlockAttentionNoGrad),
    ("plus_equals", "inputs", IN_PLACE, EncoderBlockPlusEquals),
    ("torch_default", "eps", EPS_DEFAULT, EncoderBlockTorchDefaultEps),
    ("no_proj_drop", "dropout", BLOCK_NO_PROJ_DROP, EncoderBlockWithoutProjDrop),
    ("no_attn_drop", "dropout", BLOCK_NO_PROJ_DROP, EncoderBlockWithoutAttnDrop),
    ("mlp_without_drop", "dropout", BLOCK_NO_PROJ_DROP, EncoderBlockMLPWithoutDrop),
    ("shared_norm", "output", "the same LayerNorm is used twice: the block has two, norm1 before attention and norm2 "
     "before the MLP", EncoderBlockSharedNorm),
    ("norm_in_residual", "output", "the residual adds the normalised x: add the branch to x itself, x = x + "
     "attn(norm1(x))", EncoderBlockAddsNormalisedX),
    ("no_mlp_residual", "output", "the residual connection around the MLP is missing: x = x + mlp(norm2(x))",
     EncoderBlockWithoutMLPResidual),
    ("no_residuals", "output", "both residual connections are missing: x = x + attn(norm1(x)); x = x + "
     "mlp(norm2(x))", EncoderBlockWithoutResiduals),
    ("mlp_first", "output", "the MLP comes before attention: attention first, then the MLP", EncoderBlockMLPFirst),
    ("residual_normalised", "output", "the residual stream is the normalised x: normalise only the branch's input, "
     "x = x + attn(norm1(x))", EncoderBlockNormalisedStream),
    ("mlp_unnormalised", "output", "the MLP reads x without its LayerNorm: x = x + mlp(norm2(x))",
     EncoderBlockMLPUnnormalised),
]]


# the accepted variants
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


class DropPathTimm(_DropPathParts):
    """timm's forward (a floored uniform draw as the mask)."""

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        mask = (keep + torch.rand(x.shape[0], *(1,) * (x.ndim - 1), dtype=x.dtype)).floor_()  # timm's trick
        return x.div(keep) * mask


class DropPathWhere(_DropPathParts):
    """No scaling factor multiplied in: torch.where keeps x / (1 - p) or gives 0, per sample."""

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        coin = torch.rand(x.shape[0], *(1,) * (x.ndim - 1)) < 1 - self.p
        return torch.where(coin, x / (1 - self.p), torch.zeros_like(x))


class BlockOwnParts(nn.Module):
    """Built in timm's order with the options inline, and timm's DropPath forward."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.ls1 = ref.LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPathTimm(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ref.MLP(dim, int(dim * mlp_ratio), drop)
        self.ls2 = ref.LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPathTimm(drop_path)

    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class BlockTwoLines(_BlockParts):
    """The branches named first, then added."""

    def forward(self, x, mask=None):
        attended = self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))  # (b, n, D)
        x = x + attended
        processed = self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # (b, n, D)
        return x + processed


VARIANTS = [Variant(exercise, name, impl) for exercise, name, impl in [
    ("MLP", "reference", ref.MLP),
    ("MLP", "erf", MLPErf),
    ("LayerNorm", "reference", ref.LayerNorm),
    ("LayerNorm", "rsqrt", LayerNormRsqrt),
    ("LayerNorm", "functional", LayerNormF),
    ("DropPath", "reference", ref.DropPath),
    ("DropPath", "timm", DropPathTimm),
    ("DropPath", "where", DropPathWhere),
    ("EncoderBlock", "reference", ref.EncoderBlock),
    ("EncoderBlock", "own_parts", BlockOwnParts),
    ("EncoderBlock", "two_lines", BlockTwoLines),
    ("EncoderBlock", "statement_parts", _BlockParts),
]]
