"""Check of vit_course/blocks.py's assembly (chapter 03): EncoderBlock (pre-norm residuals, options, drop path
while training)."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch

from .. import blocks as ref
from .core import check
from .gradients import gradient_flow
from .modules import randomize_norms
from .slips import random_mask
from .wiring import dropout_wiring

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
