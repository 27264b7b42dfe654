"""Checks for chapter 03: MLP, LayerNorm, DropPath, EncoderBlock."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F

from .. import blocks as ref
from .attention import _accepts, _no_fully_masked_rows
from .core import check, randomize_norms


@check("MLP")
def MLP(c, cls):
    """MLP(dim, hidden_dim, drop=0.): fc1 -> exact GELU -> fc2, on any leading shape."""
    g = torch.Generator().manual_seed(6)
    for dim, hidden, shape in ((6, 24, (2, 5)), (5, 3, (7,)), (8, 32, (2, 3, 4))):
        reference = ref.MLP(dim, hidden).eval()
        model = c.build(cls, dim, hidden)
        c.load(model, reference, [("fc", "name the two Linear layers fc1 (dim -> hidden_dim) and fc2 (back to dim)")])
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
            ], atol=1e-5)


@check("LayerNorm")
def LayerNorm(c, cls):
    """LayerNorm(dim, eps=1e-6): normalise each token over its features, biased variance, then weight and bias."""
    g = torch.Generator().manual_seed(7)
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
                        ("the mean and variance are taken over the wrong axis: normalise each token over its "
                         "own features, the last axis", lambda: (x - x.mean(0, keepdim=True)) / torch.sqrt(
                             x.var(0, unbiased=False, keepdim=True) + eps) * w + b),
                    ])
        constant = torch.full((2, dim), 3.0)
        with torch.no_grad():
            got = c.call(model, constant, label=f"LayerNorm({dim}, eps={eps})")
        c.close(got, F.layer_norm(constant, (dim,), w, b, eps), "output for tokens whose features are all equal "
                "(variance 0: eps keeps the division finite)")


@check("DropPath")
def DropPath(c, cls):
    """DropPath(p): in training, zero whole samples with probability p, scale the rest by 1/(1-p); eval: identity."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4000, 3, 5, generator=g) + 3  # no exact zeros
    for p in (0.0, 0.25, 0.6):
        module = c.build(cls, p)
        label = f"DropPath({p})"
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
        flat = (out / x).flatten(1)  # (b, values): 0 or 1/(1-p) for a correct sample
        dropped = (flat == 0).all(1)
        kept = ~dropped
        mixed = ~dropped & (flat == 0).any(1)
        c.ok(not mixed.any(), f"{int(mixed.sum())} samples were partly zeroed: DropPath drops a sample's whole "
             "residual branch", "draw one coin per sample, a mask of shape (batch, 1, 1, ...), not one per element "
             "(that would be dropout)")
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
    ]


@check("EncoderBlock")
def EncoderBlock(c, cls):
    """EncoderBlock(dim, num_heads, mlp_ratio): pre-norm, x = x + attn(norm1(x)); x = x + mlp(norm2(x))."""
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
            if _accepts(model.forward, "mask"):
                mask = _no_fully_masked_rows(torch.rand(n, n, generator=g) > 0.5)
                c.close(c.call(model, x, mask=mask, label=label), reference(x, mask=mask), "output with a mask",
                        _block_variants(reference, x, mask) + [
                            ("the mask seems not to reach the attention: pass it on, self.attn(..., mask=mask)",
                             lambda: reference(x))], atol=1e-4)
