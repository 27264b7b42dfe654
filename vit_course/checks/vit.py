"""Checks for chapter 05: ViT and count_parameters."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch

from .. import vit as ref
from .core import check, randomize_norms

SMALL = dict(image_size=12, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2, mlp_ratio=2.0)


def _vit_variants(m, images):
    """(hint, thunk) pairs: the ViT assembly mistakes, built from the reference's parts."""
    def run(embed=None, final_norm=True, pool="cls"):
        x = embed() if embed else m.embed(images)  # (b, n, D)
        for block in m.blocks:
            x = block(x)
        x = m.norm(x) if final_norm else x
        x = {"cls": x[:, 0], "mean": x[:, 1:].mean(1), "all": x.mean(1), "last": x[:, -1]}[pool]  # (b, D)
        return m.head(x)

    def tokens():
        return m.patch_embed(images)  # (b, N, D)

    cls = lambda: m.cls_token.expand(len(images), -1, -1)  # noqa: E731
    return [
        ("the final LayerNorm `norm` is not applied before the head", lambda: run(final_norm=False)),
        ("the head reads the mean of the patch tokens: read the class token's final state, x[:, 0]",
         lambda: run(pool="mean")),
        ("the head reads the mean of all tokens: read the class token's final state, x[:, 0]",
         lambda: run(pool="all")),
        ("the class token is appended: prepend it (token 0) and read x[:, 0]",
         lambda: run(lambda: torch.cat([tokens(), cls()], 1) + m.pos_embed, pool="last")),
        ("the class token is appended: prepend it (token 0) and read x[:, 0]",
         lambda: run(lambda: torch.cat([tokens(), cls()], 1) + m.pos_embed)),
        ("the position embeddings are missing: add pos_embed after prepending the class token",
         lambda: run(lambda: torch.cat([cls(), tokens()], 1))),
    ]


@check("ViT")
def ViT(c, cls):
    """ViT(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio) -> logits."""
    g = torch.Generator().manual_seed(15)
    for config, batch in ((SMALL, 3), (dict(SMALL, image_size=8, patch_size=2, in_channels=1, num_classes=3, dim=12,
                                            depth=1, num_heads=3, mlp_ratio=4.0), 2)):
        reference = randomize_norms(ref.ViT(**config).eval(), g)
        with torch.no_grad():  # timm starts the class token at zero: make it matter
            reference.cls_token.normal_(generator=g)
            reference.pos_embed.normal_(generator=g)
        model = c.build(cls, **config)
        c.load(model, reference, [
            ("patch_embed", "the patch embedding is `patch_embed` (a PatchEmbedding with a Linear `proj`)"),
            ("cls_token", "the class token is a parameter `cls_token` of shape (1, 1, dim)"),
            ("pos_embed", "the position embeddings are a parameter `pos_embed` of shape (1, N + 1, dim)"),
            ("blocks", "the encoder blocks are an nn.ModuleList called `blocks`"),
            ("norm", "the final LayerNorm is `norm`"), ("head", "the classifier is a Linear `head` (dim -> classes)")])
        images = torch.randn(batch, config["in_channels"], config["image_size"], config["image_size"], generator=g)
        label = "ViT(" + ", ".join(f"{k}={v}" for k, v in config.items()) + ")"
        with torch.no_grad():
            got = c.call(model, images, label=label)
            c.close(got, reference(images), "logits", _vit_variants(reference, images), atol=1e-4,
                    shape_hints=[((batch, config["dim"]), "this is the class token's features: apply the head")])


CONFIGS = [
    ref.CONFIGS["ViT-B/16"],
    ref.CONFIGS["ViT-Ti/16"],
    dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=64, depth=3, num_heads=4, mlp_ratio=2.0),
    dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=96, depth=5, num_heads=3, mlp_ratio=3.0),
]


def _mistakes(cfg):
    """(hint, parameters the mistake leaves out) for one configuration."""
    d, depth, classes = cfg["dim"], cfg["depth"], cfg["num_classes"]
    hidden, n = int(d * cfg.get("mlp_ratio", 4.0)), (cfg["image_size"] // cfg["patch_size"]) ** 2
    p2c = cfg["patch_size"] ** 2 * cfg["in_channels"]
    return [
        ("the class token (1 x D) is not counted, or its row of the position table ((N + 1) x D)", d),
        ("the position embeddings ((N + 1) x D) are not counted", (n + 1) * d),
        ("the class token and its position row are both missing", 2 * d),
        ("the patch projection's bias (D) is not counted", d),
        ("the patch projection (P*P*C x D weights + D biases) is not counted", p2c * d + d),
        ("the biases of the blocks' Linear layers are not counted (qkv 3D, proj D, fc1 hidden, fc2 D per block)",
         depth * (5 * d + hidden)),
        ("the biases are not counted (patch projection D; qkv 3D, proj D, fc1 hidden, fc2 D per block)",
         depth * (5 * d + hidden) + d),
        ("the biases are not counted (patch projection D; qkv 3D, proj D, fc1 hidden, fc2 D per block; head)",
         depth * (5 * d + hidden) + d + classes),
        ("the qkv bias (3D per block) is not counted", depth * 3 * d),
        ("the LayerNorms (2 x 2D per block) are not counted", depth * 4 * d),
        ("the LayerNorms are not counted (2 x 2D per block, plus 2D for the final norm)", depth * 4 * d + 2 * d),
        ("the final LayerNorm (2D) is not counted", 2 * d),
        ("the LayerNorms are counted with weights only (D each, no bias)", depth * 2 * d + d),
        ("the head (D x classes + classes) is not counted", d * classes + classes),
        ("the head's bias is not counted", classes),
        ("the attention output projection proj (D x D + D per block) is not counted", depth * (d * d + d)),
        ("every block's parameters are counted once only: multiply by depth", (depth - 1) * (
            4 * d + 4 * d * d + 4 * d + 2 * d * hidden + hidden + d)),
    ]


@check("count_parameters")
def count_parameters(c, fn):
    """count_parameters(**config) == the trainable parameters of ViT(**config), by formula."""
    for cfg in CONFIGS:
        expected = ref.count_parameters(**cfg)
        got = c.number(c.call(fn, **cfg), "the count")
        if got == expected:
            c.tests += 1
            continue
        hidden_wrong = (cfg["depth"] * 2 * cfg["dim"] * (int(cfg["dim"] * cfg.get("mlp_ratio", 4.0)) - 4 * cfg["dim"])
                        + cfg["depth"] * (int(cfg["dim"] * cfg.get("mlp_ratio", 4.0)) - 4 * cfg["dim"]))
        hints = _mistakes(cfg) + [("the MLP width ignores mlp_ratio: hidden = int(dim * mlp_ratio)", hidden_wrong)]
        hint = None
        for text, missing in hints:
            if missing and expected - got == missing:
                hint = text
            elif missing and got - expected == missing:
                hint = f"{got - expected:,.0f} too many, exactly this part (counted twice?): {text}"
            if hint:
                break
        c.fail(f"counted {got:,.0f} parameters, expected {expected:,} ({expected - got:+,.0f})", hint)


@check("pool_tokens")
def pool_tokens(c, fn):
    """pool_tokens(x (b, n, D), pool, num_prefix_tokens) -> (b, D): the class token, or the mean of the patch tokens."""
    g = torch.Generator().manual_seed(23)
    for b, n, d, prefix in ((2, 5, 3, 1), (3, 7, 4, 1), (2, 6, 5, 0), (1, 9, 2, 2)):
        x = torch.randn(b, n, d, generator=g)
        for pool in ("cls", "mean") if prefix else ("mean",):
            got = c.call(fn, x, pool, prefix)
            mistakes = [
                ("the mean includes the class token: average the patch tokens only, x[:, num_prefix_tokens:]",
                 lambda: x.mean(1)),
                ("this is the last token, not the class token: the class token is token 0", lambda: x[:, -1]),
                ("this is the mean of the tokens: for pool='cls' read the class token, x[:, 0]",
                 lambda: x[:, prefix:].mean(1)),
                ("this is the class token: for pool='mean' average the patch tokens", lambda: x[:, 0]),
                ("the mean leaves out one token whatever num_prefix_tokens is: use x[:, num_prefix_tokens:]",
                 lambda: x[:, 1:].mean(1)),
            ]
            c.close(got, ref.pool_tokens(x, pool, prefix), f"pool_tokens(x, {pool!r}, {prefix})", mistakes,
                    shape_hints=[((b, n - prefix), "you averaged over the features: average over the tokens, dim=1"),
                                 ((b, 1, d), "drop the token axis: .mean(dim=1), not keepdim")])
