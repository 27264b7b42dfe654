"""Checks of vit_course/vit.py's model: ViT (chapter 05: assembly, initial values, sin-cos buffer, mean pooling,
drop-path rates) and pool_tokens (chapter 07: the class token, or the mean of the patch tokens)."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
from torch import nn

from .. import vit as ref
from .core import check
from .gradients import gradient_flow
from .messages import describe
from .modules import randomize_norms
from .vit_options import hybrid, strong_blocks

SMALL = dict(image_size=12, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2, mlp_ratio=2.0)


def _vit_variants(m, images):
    """(hint, thunk) pairs: the ViT assembly mistakes, built from the reference's parts."""
    k = m.num_prefix_tokens

    def run(embed=None, final_norm=True, pool="cls", blocks=None, norm_first=False):
        x = embed() if embed else m.embed(images)  # (b, n, D)
        x = m.norm(x) if norm_first else x
        for block in m.blocks if blocks is None else blocks:
            x = block(x)
        x = m.norm(x) if final_norm and not norm_first else x
        x = {"cls": lambda: x[:, 0], "mean": lambda: x[:, k:].mean(1), "all": lambda: x.mean(1),
             "last": lambda: x[:, -1], "skip1": lambda: x[:, 1:].mean(1)}[pool]()  # (b, D)
        return m.head(x)

    def tokens():
        return m.patch_embed(images)  # (b, N, D)

    cls = lambda: m.cls_token.expand(len(images), -1, -1)  # noqa: E731
    if m.pool == "mean":
        return [
            ("mean pooling averages the class token in with the patches: average the patch tokens only, "
             "x[:, num_prefix_tokens:] (pool_tokens(x, self.pool, self.num_prefix_tokens) does)",
             lambda: run(pool="all")),
            ("pool='mean' reads the class token: average the patch tokens, x[:, num_prefix_tokens:].mean(1)",
             lambda: run(pool="cls")),
            ("the mean leaves out token 0, a patch token here (there is no class token): average "
             "x[:, num_prefix_tokens:]", lambda: run(pool="skip1")),
            ("the final LayerNorm `norm` is not applied before pooling", lambda: run(final_norm=False, pool="mean")),
        ]
    return [
        ("the final LayerNorm `norm` is not applied before the head", lambda: run(final_norm=False)),
        ("only the first block is applied: run every block in turn, `for block in self.blocks: x = block(x)`",
         lambda: run(blocks=m.blocks[:1])),
        ("the final norm is applied before the blocks: blocks first, then `self.norm`, then pooling",
         lambda: run(norm_first=True)),
        ("the head reads the last token: the class token is token 0, x[:, 0] (pool_tokens does it)",
         lambda: run(pool="last")),
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
        ("the class token gets no position: prepend it first, then add all of pos_embed",
         lambda: run(lambda: torch.cat([cls(), tokens() + m.pos_embed[:, 1:]], 1))),
    ]


def _embed_variants(m, images):
    """(hint, thunk) pairs: the mistakes of embed(images), built from the reference's parts."""
    if m.cls_token is None:
        return [("the position embeddings are missing: add pos_embed to the patch tokens",
                 lambda: m.patch_embed(images))]
    tokens, cls = (lambda: m.patch_embed(images)), (lambda: m.cls_token.expand(len(images), -1, -1))
    return [
        ("the class token is appended: prepend it (token 0), add_class_token_and_position does",
         lambda: torch.cat([tokens(), cls()], 1) + m.pos_embed),
        ("the position embeddings are missing: add pos_embed after prepending the class token",
         lambda: torch.cat([cls(), tokens()], 1)),
        ("the class token gets no position: prepend it first, then add all of pos_embed",
         lambda: torch.cat([cls(), tokens() + m.pos_embed[:, 1:]], 1))]


def _compare(c, cls, config, g, hints=(), gradients=False):
    """Build the learner's ViT(**config), copy a randomised reference's weights in, compare the logits."""
    reference = randomize_norms(ref.ViT(**config).eval(), g)
    with torch.no_grad():  # a new class token is zero: make it matter
        if reference.cls_token is not None:
            reference.cls_token.normal_(generator=g)
        if isinstance(reference.pos_embed, nn.Parameter):
            reference.pos_embed.normal_(generator=g)
    model = c.build(cls, **config)
    c.load(model, reference, [*hints,
        ("patch_embed", "the patch embedding is `patch_embed` (a PatchEmbedding with a Linear `proj`)"),
        ("cls_token", "the class token is a parameter `cls_token` of shape (1, 1, dim)"),
        ("pos_embed", "the position embeddings are a parameter `pos_embed` of shape (1, N + 1, dim)"),
        ("blocks", "the encoder blocks are an nn.ModuleList called `blocks`"),
        ("norm", "the final LayerNorm is `norm`"), ("head", "the classifier is a Linear `head` (dim -> classes)")])
    batch = 3
    images = torch.randn(batch, config["in_channels"], config["image_size"], config["image_size"], generator=g)
    label = "ViT(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"
    before = c.rule
    with torch.no_grad():
        c.phase("embed")
        method = getattr(model, "embed", None)
        if not callable(method):
            c.fail("your ViT has no method embed", "write embed(images) -> (b, n, D) as the exercise asks")
        c.close(c.call(method, images, label=f"{label}.embed"), reference.embed(images), "tokens from embed(images)",
                _embed_variants(reference, images), shape_hints=[
                    ((batch, reference.patch_embed.num_patches, config["dim"]), "the class token is missing: "
                     "add_class_token_and_position(tokens, self.cls_token, self.pos_embed)")])
        c.phase(before)
        got = c.call(model, images, label=label)
        c.close(got, reference(images), "logits", _vit_variants(reference, images), atol=1e-4,
                shape_hints=[((batch, config["dim"]), "this is the pooled features: apply the head")])
    c.attributes(model, label, [("grid_size", reference.grid_size, "self.grid_size = self.patch_embed.grid_size")])
    if gradients:
        gradient_flow(c, cls, lambda _: c.call(model, images, label=label), lambda _: reference(images), {}, model,
                      reference, what="the logits")


@check("ViT")
def ViT(c, cls):
    """ViT(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio, pool, pos_embed,
    class_token, ..., drop_path) -> logits: timm's names, grid_size, embed(images), the initial values, a sin-cos
    buffer, pooling, drop-path rates rising with depth; gradients reach every parameter."""
    g = torch.Generator().manual_seed(15)
    _compare(c, cls, SMALL, g, gradients=True)
    _compare(c, cls, dict(SMALL, image_size=8, patch_size=2, in_channels=1, num_classes=3, dim=12, depth=1,
                          num_heads=3, mlp_ratio=4.0), g)
    _initial_values(c, cls)
    _sincos(c, cls, g)
    c.phase("pool")
    no_class_token = ("cls_token", "with pool='mean' and class_token=None there is no class token: "
                                   "self.cls_token = None (class_token defaults to pool == 'cls')")
    _compare(c, cls, dict(SMALL, pool="mean"), g, [no_class_token], gradients=True)
    _compare(c, cls, dict(SMALL, pool="mean", class_token=True), g)
    c.phase("blocks")
    _compare(c, cls, dict(SMALL, qkv_bias=False, init_values=0.1), g, [
        ("qkv.bias", "qkv_bias=False: pass qkv_bias on to every EncoderBlock"),
        ("gamma", "init_values=0.1: pass init_values on to every EncoderBlock (LayerScale)")])
    _drop_path_rates(c, cls)
    strong_blocks(c, cls, g)
    hybrid(c, cls, g)


def _initial_values(c, cls):
    """A new model: the class token at zero, learned positions small random numbers (std 0.02)."""
    c.phase("initial")
    model = c.build(cls, **SMALL)
    token, pos = model.cls_token.detach(), model.pos_embed.detach()
    c.ok(bool(torch.all(token == 0)), "a new model's cls_token should be zeros, got values from "
         f"{token.min().item():.3g} to {token.max().item():.3g}", "nn.Parameter(torch.zeros(1, 1, dim))")
    std = pos.std().item()
    c.ok(0.01 < std < 0.04 and abs(pos.mean().item()) < 0.01, "a new model's pos_embed should be small random "
         f"numbers (std 0.02), got mean {pos.mean().item():.3g} and std {std:.3g}",
         "nn.Parameter(torch.randn(1, n, dim) * 0.02)")


def _sincos(c, cls, g):
    """pos_embed="sincos": a buffer (not trained), a zero row per class token (none with pool="mean"), the table."""
    c.phase("sincos")
    for pool in ("cls", "mean"):
        _sincos_table(c, cls, dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=64, depth=1,
                                   num_heads=4, mlp_ratio=2.0, pos_embed="sincos", pool=pool))


def _sincos_table(c, cls, config):
    reference = ref.ViT(**config)
    model = c.build(cls, **config)
    pos = getattr(model, "pos_embed", None)
    if isinstance(pos, nn.Parameter):
        extra = f": {pos.numel():,} trainable parameters too many (+{pos.numel():,})" if pos.requires_grad else ""
        c.fail(f"with pos_embed='sincos' the position table is an nn.Parameter{extra}",
               "the sin-cos table is fixed, not learned: store it with self.register_buffer('pos_embed', table)")
    c.ok("pos_embed" in dict(model.named_buffers()), f"with pos_embed='sincos', pos_embed should be a buffer, got "
         f"{describe(pos)}", "self.register_buffer('pos_embed', table): saved and moved with the model, never trained")
    k = reference.num_prefix_tokens
    table, zero = reference.pos_embed[0, k:], torch.zeros(1, config["dim"])
    variants = [("the class token's zero row goes in front: torch.cat([torch.zeros(k, dim), table])[None]",
                 lambda: torch.cat([table, zero])[None]),
                ("the class token's row repeats a patch's row: it is a row of zeros, torch.cat([torch.zeros(k, dim), "
                 "table])[None]", lambda: torch.cat([table[:1], table])[None])]
    wrong_rows = ("the class token needs a position row too: a zero row in front, (1, N + 1, D)" if k else
                  "with pool='mean' and class_token=None there is no class token, so no zero row: one per prefix "
                  "token, torch.zeros(self.num_prefix_tokens, dim), none here")
    n = reference.pos_embed.shape[1]  # the table with the wrong number of zero rows: one too few, or one too many
    shapes = [((1, n - 1 if k else n + 1, 64), wrong_rows), ((n, 64), "add the batch axis in front: table[None]")]
    c.close(pos, reference.pos_embed, f"sin-cos position table (pos_embed) with pool={config['pool']!r}",
            variants if k else [], shape_hints=shapes)
    c.load(model, reference, [("pos_embed", "register the table as a buffer named pos_embed, persistent (the "
                                            "default of register_buffer), so it is saved with the model")])


def _drop_path_rates(c, cls):
    """Stochastic depth rises linearly over the blocks: drop_path * i / max(depth - 1, 1)."""
    c.phase("drop_path")
    depth, top = 4, 0.3
    model = c.build(cls, **dict(SMALL, depth=depth, drop_path=top))
    got = [round(max((float(getattr(m, "p", getattr(m, "drop_prob", 0.0)) or 0.0) for name, m in
                      block.named_modules() if name.startswith("drop_path")), default=0.0), 6)
           for block in model.blocks]
    expected = [round(top * i / (depth - 1), 6) for i in range(depth)]
    wrong = {"the rates rise to drop_path * (depth - 1) / depth only: divide by depth - 1, drop_path * i / "
             "max(depth - 1, 1), so the last block gets drop_path itself": [top * i / depth for i in range(depth)],
             "the first block should get 0 and the last drop_path: drop_path * i / max(depth - 1, 1)":
                 [top * (i + 1) / depth for i in range(depth)],
             "every block gets the same rate: it rises linearly from 0 (first block) to drop_path (last)":
                 [top] * depth,
             "the rates fall with depth: the first block gets 0, the last drop_path": expected[::-1],
             "drop_path seems ignored: give block i the rate drop_path * i / max(depth - 1, 1), "
             "EncoderBlock(..., drop_path=rate)": [0.0] * depth}
    hint = next((h for h, rates in wrong.items() if [round(r, 6) for r in rates] == got), None)
    c.ok(got == expected, f"with drop_path={top} and depth={depth} the blocks' drop-path rates are {got}, expected "
         f"{expected} (rising linearly from 0 to drop_path)", hint)
    c.build(cls, **dict(SMALL, depth=1, drop_path=top))  # one block: max(depth - 1, 1) avoids a division by 0


@check("pool_tokens")
def pool_tokens(c, fn):
    """pool_tokens(x (b, n, D), pool, num_prefix_tokens) -> (b, D): the class token, or the mean of the patch tokens;
    gradients reach x; ValueErrors for pool='cls' without a class token and for any other pool."""
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
            if (b, n) == (2, 5):
                gradient_flow(c, fn, lambda t: c.call(fn, t["x"], pool, prefix),
                              lambda t: ref.pool_tokens(t["x"], pool, prefix), dict(x=x))
    x = torch.randn(2, 5, 3, generator=g)
    c.raises(fn, x, "cls", 0, why="pool='cls' with num_prefix_tokens=0: there is no class token to read",
             hint="raise a ValueError when pool == 'cls' and num_prefix_tokens < 1", rule="error")
    c.raises(fn, x, "max", 1, why="pool='max' is neither 'cls' nor 'mean'",
             hint="end with `raise ValueError(...)` naming the pool you got")
