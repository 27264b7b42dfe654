"""More of ViT's check (chapter 05): a model whose blocks matter (larger weights, so each block changes the logits
well beyond rounding), its dropouts while training, its final norm's eps and the hybrid stem."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the function that builds it)

import torch
from torch import nn

from .. import vit as ref
from .modules import randomize_norms
from .probes import call_naming, works_on
from .wiring import dropout_wiring

SMALL = dict(image_size=12, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=3, num_heads=2, mlp_ratio=2.0)
HYBRID = dict(SMALL, image_size=16, patch_size=2, stem_channels=(4, 8))  # the stem: 16x16x3 -> 4x4x8


def _strong(config, g):
    """The reference ViT(**config) in eval mode, its blocks' Linear weights of std 0.3 (not 0.02) and random norms."""
    reference = randomize_norms(ref.ViT(**config).eval(), g)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name.startswith("blocks.") and p.ndim == 2:
                p.normal_(0, 0.3, generator=g)
        if reference.cls_token is not None:
            reference.cls_token.normal_(generator=g)
    return reference


def _variants(m, images):
    """(hint, thunk) pairs: the assembly mistakes of forward that only a model with strong blocks shows clearly."""
    def run(blocks=None, norm_first=False, token=0):
        x = m.embed(images)  # (b, n, D)
        x = m.norm(x) if norm_first else x
        for block in m.blocks if blocks is None else blocks:
            x = block(x)
        x = x if norm_first else m.norm(x)
        return m.head(x[:, token])

    return [
        ("only the first block is applied: run every block in turn, `for block in self.blocks: x = block(x)`",
         lambda: run(m.blocks[:1])),
        ("only the last block is applied: run every block in turn, `for block in self.blocks: x = block(x)`",
         lambda: run(m.blocks[-1:])),
        ("the final norm is applied before the blocks: blocks first, then `self.norm`, then pooling",
         lambda: run(norm_first=True)),
        ("the head reads the last token: the class token is token 0, x[:, 0] (pool_tokens does it)",
         lambda: run(token=-1)),
    ]


def strong_blocks(c, cls, g):
    """With blocks that matter: the logits in eval mode, the final norm's eps, the dropouts while training.
    """
    config = dict(SMALL, drop=0.1, attn_drop=0.3)
    reference = _strong(config, g)
    label = "ViT(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"
    model = c.load(c.build(cls, **config), reference)
    images = torch.randn(2, 3, 12, 12, generator=g)
    c.phase("output")
    with torch.no_grad():
        c.close(c.call(model, images, label=label), reference(images), "logits (blocks with larger weights)",
                _variants(reference, images), atol=1e-4)
    c.phase("eps")
    eps = getattr(getattr(model, "norm", None), "eps", 1e-6)
    c.ok(eps == 1e-6, f"norm.eps is {eps:g}, the statement's is 1e-6", "norm = nn.LayerNorm(dim, eps=1e-6): "
         "PyTorch's default eps is 1e-5, ViT's (and timm's) 1e-6")
    c.phase("blocks")
    n = reference.patch_embed.num_patches + 1
    dropout_wiring(c, model, reference, images, label, {
        (0.3, (2, 2, n, n)): "attn_drop=0.3 on the attention weights",
        (0.1, (2, n, 16)): "drop=0.1 after the attention's proj and the MLP's fc2",
        (0.1, (2, n, 32)): "drop=0.1 in the MLP after GELU"},
        "EncoderBlock(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, rate, init_values): the arguments "
        "in the statement's order (or by name, drop=drop, attn_drop=attn_drop)")


STEM_SKIPPED = "embed skips the stem: tokens = self.patch_embed(self.stem(images)) (the stem is nn.Identity() " \
               "for a plain ViT)"


def hybrid(c, cls, g):
    """A hybrid ViT: the patch embedding is built for the stem's output and embed runs the stem first.
    """
    reference = randomize_norms(ref.ViT(**HYBRID).eval(), g)
    label = "ViT(" + ", ".join(f"{k}={v!r}" for k, v in HYBRID.items()) + ")"
    c.phase("names")
    model = c.build(cls, **HYBRID)
    embedding = getattr(model, "patch_embed", None)
    built = (tuple(getattr(embedding, "image_size", ())), getattr(embedding, "in_channels", None))
    c.ok(built == ((4, 4), 8), f"in {label} the stem turns 16x16x3 images into 4x4x8 maps, but patch_embed is "
         f"built for images of size {built[0]} with {built[1]} channels", "the patches are cut from the stem's "
         "output: PatchEmbedding(token_image, patch_size, token_channels, dim), the given lines set both")
    model = c.load(model, reference)
    images = torch.randn(2, 3, 16, 16, generator=g)
    c.phase("embed")
    with torch.no_grad():
        stem = getattr(model, "stem", nn.Identity())
        got = call_naming(c, model.embed, images, cause=lambda: STEM_SKIPPED if works_on(
            model.patch_embed, stem(images)) else None)
        c.close(got, reference.embed(images), "tokens from embed(images) of a hybrid ViT")
        c.phase("output")
        c.close(c.call(model, images, label=label), reference(images), "logits of a hybrid ViT", atol=1e-4)

