"""Chapter 05's exercises: ViT (assembly, initial values, sin-cos buffer, mean pooling, drop-path rates; a
model whose blocks matter, its dropouts, its final norm's eps and the hybrid stem) and count_parameters (by
formula, with the hints of the usual omissions): checks and rules."""

import functools
import numbers

import torch
from torch import nn

from .. import vit as ref
from .ch04_patch_embeddings import PatchEmbeddingConv
from .core import IN_PLACE, NAN, PLAIN_NUMBER, Slip, Variant, check
from .gradients import CUT_AT, NOT_TRAINED, gradient_flow
from .messages import describe, known
from .modules import randomize_norms
from .probes import TorchCalls, call_naming, works_on
from .wiring import dropout_wiring

VIT_APPENDED = "the class token is appended: prepend it (token 0), add_class_token_and_position does"
VIT_FIRST_BLOCK = "only the first block is applied: run every block in turn, `for block in self.blocks: x = block(x)`"
VIT_SAME = "every block gets the same rate: it rises linearly from 0 (first block) to drop_path (last)"
VIT_FLOAT = "use // to count the patches (or int(...)): / always gives a float"
VIT_BUILT = ("count by formula, without building the model or any tensor: the point is to size models too big for "
             "your memory")
VIT_NO_POSITION = "the position embeddings are missing: add pos_embed after prepending the class token"
VIT_CLS_NO_POSITION = "the class token gets no position: prepend it first, then add all of pos_embed"
VIT_MEAN_HEAD = "the head reads the mean of the patch tokens: read the class token's final state, x[:, 0]"
VIT_ZERO_ROW_FIRST = "the class token's zero row goes in front: torch.cat([torch.zeros(k, dim), table])[None]"
VIT_NO_ZERO_ROW = ("with pool='mean' and class_token=None there is no class token, so no zero row: one per "
                          "prefix token, torch.zeros(self.num_prefix_tokens, dim), none here")
SMALL = dict(image_size=12, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2, mlp_ratio=2.0)


def _twins(reference, config, rules, method, images):
    """(slip, thunk) pairs for ``close``: the ViT slips of ``rules``, each built with ``config`` and the reference's
    weights (its Linear patch projection as the slip's Conv2d), its ``method`` run on ``images``."""
    def output(slip):
        twin = slip.impl(**config).eval()
        state = reference.state_dict()
        weight = state["patch_embed.proj.weight"]  # (D, P*P*C) -> the Conv2d's (D, C, P, P)
        dim, channels, p, _ = twin.patch_embed.proj.weight.shape
        state["patch_embed.proj.weight"] = weight.reshape(dim, p, p, channels).permute(0, 3, 1, 2)
        twin.load_state_dict(state)
        return getattr(twin, method)(images)
    return [(s, functools.partial(output, s)) for rule in rules for s in SLIPS if (s.exercise, s.rule) == ("ViT", rule)]


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
        ("patch_embed", HINT["renamed"]),
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
            c.fail("your ViT has no method embed", HINT["no_embed"])
        c.close(c.call(method, images, label=f"{label}.embed"), reference.embed(images), "tokens from embed(images)",
                _twins(reference, config, ["embed"], "embed", images), shape_hints=[
                    ((batch, reference.patch_embed.num_patches, config["dim"]), "the class token is missing: "
                     "add_class_token_and_position(tokens, self.cls_token, self.pos_embed)")])
        c.phase(before)
        got = c.call(model, images, label=label)
        c.close(got, reference(images), "logits", _twins(reference, config, [before, "embed"], "forward", images),
                atol=1e-4, shape_hints=[((batch, config["dim"]), "this is the pooled features: apply the head")])
    c.attributes(model, label, [("grid_size", reference.grid_size, HINT["no_grid"])])
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
    _sincos(c, cls, "cls")
    _sincos(c, cls, "mean")
    c.phase("pool")
    no_class_token = ("cls_token", "with pool='mean' and class_token=None there is no class token: "
                                   "self.cls_token = None (class_token defaults to pool == 'cls')")
    _compare(c, cls, dict(SMALL, pool="mean"), g, [no_class_token], gradients=True)
    _compare(c, cls, dict(SMALL, pool="mean", class_token=True), g)
    c.phase("blocks")
    _compare(c, cls, dict(SMALL, qkv_bias=False, init_values=0.1), g, [
        ("qkv.bias", HINT["options_ignored"]),
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
         f"{token.min().item():.3g} to {token.max().item():.3g}", HINT["cls_random"])
    std = pos.std().item()
    c.ok(0.01 < std < 0.04 and abs(pos.mean().item()) < 0.01, "a new model's pos_embed should be small random "
         f"numbers (std 0.02), got mean {pos.mean().item():.3g} and std {std:.3g}", HINT["pos_std1"])


def _sincos(c, cls, pool):
    """pos_embed="sincos": a buffer (not trained), a zero row per class token (none with pool="mean"), the table."""
    c.phase("sincos")
    config = dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=64, depth=1, num_heads=4,
                  mlp_ratio=2.0, pos_embed="sincos", pool=pool)
    reference = ref.ViT(**config)
    model = c.build(cls, **config)
    pos = getattr(model, "pos_embed", None)
    if isinstance(pos, nn.Parameter):
        extra = f": {pos.numel():,} trainable parameters too many (+{pos.numel():,})" if pos.requires_grad else ""
        c.fail(f"with pos_embed='sincos' the position table is an nn.Parameter{extra}", HINT["parameter"])
    c.ok("pos_embed" in dict(model.named_buffers()), f"with pos_embed='sincos', pos_embed should be a buffer, got "
         f"{describe(pos)}", "self.register_buffer('pos_embed', table): saved and moved with the model, never trained")
    k = reference.num_prefix_tokens
    wrong_rows = ("the class token needs a position row too: a zero row in front, (1, N + 1, D)" if k else
                  VIT_NO_ZERO_ROW)
    n = reference.pos_embed.shape[1]  # the table with the wrong number of zero rows: one too few, or one too many
    shapes = [((1, n - 1 if k else n + 1, 64), wrong_rows), ((n, 64), "add the batch axis in front: table[None]")]
    c.close(pos, reference.pos_embed, f"sin-cos position table (pos_embed) with pool={config['pool']!r}",
            [(s, lambda s=s: s.impl(**config).pos_embed) for s in SLIPS if s.exercise == "ViT" and s.rule == "sincos"],
            shape_hints=shapes)
    c.load(model, reference, [("pos_embed", "register the table as a buffer named pos_embed, persistent (the "
                                            "default of register_buffer), so it is saved with the model")])


def _rates(model):
    """The drop-path rate of each of the model's blocks (0 for a block without one)."""
    return [round(max((float(getattr(m, "p", getattr(m, "drop_prob", 0.0)) or 0.0) for name, m in
                       block.named_modules() if name.startswith("drop_path")), default=0.0), 6)
            for block in model.blocks]


def _drop_path_rates(c, cls):
    """Stochastic depth rises linearly over the blocks: drop_path * i / max(depth - 1, 1)."""
    c.phase("drop_path")
    depth, top = 4, 0.3
    config = dict(SMALL, depth=depth, drop_path=top)
    got = _rates(c.build(cls, **config))
    expected = [round(top * i / (depth - 1), 6) for i in range(depth)]
    slips = [s for s in SLIPS if s.exercise == "ViT" and s.rule == "drop_path"]
    c.ok(got == expected, f"with drop_path={top} and depth={depth} the blocks' drop-path rates are {got}, expected "
         f"{expected} (rising linearly from 0 to drop_path)",
         c.diagnose(slips, lambda rates: rates == got, lambda impl: _rates(impl(**config))))
    c.build(cls, **dict(SMALL, depth=1, drop_path=top))  # one block: max(depth - 1, 1) avoids a division by 0


DEEPER = dict(image_size=12, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=3, num_heads=2, mlp_ratio=2.0)
HYBRID = dict(DEEPER, image_size=16, patch_size=2, stem_channels=(4, 8))  # the stem: 16x16x3 -> 4x4x8


def strong_blocks(c, cls, g):
    """With blocks that matter: the logits in eval mode, the final norm's eps, the dropouts while training."""
    config = dict(DEEPER, drop=0.1, attn_drop=0.3)
    reference = randomize_norms(ref.ViT(**config).eval(), g)
    with torch.no_grad():  # the blocks' Linear weights of std 0.3 (not 0.02)
        for name, p in reference.named_parameters():
            if name.startswith("blocks.") and p.ndim == 2:
                p.normal_(0, 0.3, generator=g)
        reference.cls_token.normal_(generator=g)
    label = "ViT(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"
    model = c.load(c.build(cls, **config), reference)
    images = torch.randn(2, 3, 12, 12, generator=g)
    c.phase("output")
    with torch.no_grad():
        c.close(c.call(model, images, label=label), reference(images), "logits (blocks with larger weights)",
                _twins(reference, config, ["output", "embed"], "forward", images), atol=1e-4)
    c.phase("eps")
    eps = getattr(getattr(model, "norm", None), "eps", 1e-6)
    c.ok(eps == 1e-6, f"norm.eps is {eps:g}, the statement's is 1e-6", HINT["torch_default"])
    c.phase("blocks")
    n = reference.patch_embed.num_patches + 1
    dropout_wiring(c, model, reference, images, label, {
        (0.3, (2, 2, n, n)): "attn_drop=0.3 on the attention weights",
        (0.1, (2, n, 16)): "drop=0.1 after the attention's proj and the MLP's fc2",
        (0.1, (2, n, 32)): "drop=0.1 in the MLP after GELU"},
        HINT["drops_swapped"])


def hybrid(c, cls, g):
    """A hybrid ViT: the patch embedding is built for the stem's output and embed runs the stem first."""
    reference = randomize_norms(ref.ViT(**HYBRID).eval(), g)
    label = "ViT(" + ", ".join(f"{k}={v!r}" for k, v in HYBRID.items()) + ")"
    c.phase("names")
    model = c.build(cls, **HYBRID)
    embedding = getattr(model, "patch_embed", None)
    built = (tuple(getattr(embedding, "image_size", ())), getattr(embedding, "in_channels", None))
    c.ok(built == ((4, 4), 8), f"in {label} the stem turns 16x16x3 images into 4x4x8 maps, but patch_embed is "
         f"built for images of size {built[0]} with {built[1]} channels", HINT["pe_image_size"])
    model = c.load(model, reference)
    images = torch.randn(2, 3, 16, 16, generator=g)
    c.phase("embed")
    with torch.no_grad():
        stem = getattr(model, "stem", nn.Identity())
        got = call_naming(c, model.embed, images, cause=lambda: HINT["no_stem"] if works_on(
            model.patch_embed, stem(images)) else None)
        c.close(got, reference.embed(images), "tokens from embed(images) of a hybrid ViT")
        c.phase("output")
        c.close(c.call(model, images, label=label), reference(images), "logits of a hybrid ViT", atol=1e-4)


CONFIGS = [
    ref.CONFIGS["ViT-B/16"],
    ref.CONFIGS["ViT-Ti/16"],
    dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=64, depth=3, num_heads=4, mlp_ratio=2.0),
    dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=96, depth=5, num_heads=3, mlp_ratio=3.0),
]
OPTIONS = [dict(CONFIGS[2], **options) for options in (
    dict(pos_embed="sincos"), dict(pool="mean"), dict(pool="mean", class_token=True), dict(qkv_bias=False),
    dict(init_values=0.1), dict(pool="mean", pos_embed="sincos"))]


STEMS = [  # a non-square image and hybrids, tried after the configurations above
    dict(image_size=(28, 20), patch_size=4, in_channels=3, num_classes=10, dim=32, depth=2, num_heads=2, mlp_ratio=2.0),
    dict(image_size=32, patch_size=2, in_channels=3, num_classes=10, dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
         stem_channels=(16, 32)),
    dict(image_size=(28, 36), patch_size=2, in_channels=1, num_classes=7, dim=24, depth=1, num_heads=2, mlp_ratio=2.0,
         stem_channels=(8,)),
]


def _hint(c, cfg, expected, got):
    """The likely cause of a wrong count: the catalogue's counting slips that give the learner's count on cfg (all of
    them when several leave out that many), else those that leave out exactly the learner's excess."""
    counts = [(s, s.impl(**cfg)) for s in c.slips("output")]
    short = [s for s, n in counts if n == got]
    extra = [s.hint for s, n in counts if n < expected and got - expected == expected - n]
    if short:  # several slips can leave out the same number (D, 2D): name them all rather than guess one
        return short[0] if len(short) == 1 else "one of these (each leaves out that many): " + "; or ".join(
            s.hint for s in short)
    if extra:
        return f"{got - expected:,.0f} too many, exactly this part (counted twice?): " + "; or ".join(extra)
    return None


@check("count_parameters")
def count_parameters(c, fn):
    """count_parameters(**config) == the trainable parameters of ViT(**config), by formula (no model built), as an
    int."""
    for cfg in CONFIGS + OPTIONS + STEMS:
        expected = ref.count_parameters(**cfg)
        c.phase("output")
        with TorchCalls() as calls:
            raw = c.call(fn, **cfg)
        got = c.number(raw, "the count")
        c.ok(got == expected, f"counted {got:,.0f} parameters, expected {expected:,} ({expected - got:+,.0f})",
             _hint(c, cfg, expected, got))
        if cfg is CONFIGS[0]:
            c.phase("formula")
            c.ok(calls.count == 0, f"your count called torch {calls.count} times for ViT-B/16", VIT_BUILT)
        c.phase("int")
        c.ok(isinstance(raw, numbers.Integral), f"the count should be an int, got {type(raw).__name__} {raw!r}",
             VIT_FLOAT)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "ViT": ("names", "attributes", "embed", "output", "initial", "sincos", "pool", "drop_path", "eps", "blocks",
        "gradient"),
    "count_parameters": ("output", "formula", "int"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
class ViTParts(nn.Module):
    """A ViT from the learner's parts: Conv2d patch embedding, own loop (a correct alternative). The catalogue's slips
    are its subclasses (vit_with): ``mistake``, a knob below; ``reads``, pool -> what the head reads instead (a key of
    the table in forward)."""

    mistake, reads = None, {}

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                 pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, stem_channels=None, stem_pool=True,
                 drop=0.0, attn_drop=0.0, drop_path=0.0, init_values=None):
        super().__init__()
        mistake = self.mistake
        self.stem, size, channels = ref.hybrid_stem(in_channels, stem_channels, ref.to_pair(image_size), stem_pool)
        grid = size[0] // patch_size
        self.pool, self.k = pool, int(pool == "cls" if class_token is None else class_token)
        self.patch_embed = PatchEmbeddingConv(*((image_size, patch_size, in_channels) if mistake == "pe_image_size"
                                                else (size, patch_size, channels)), dim)
        if mistake != "no_grid":
            self.grid_size = (grid, grid)
        self.k = 1 if mistake == "cls_always" else self.k
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim) + (mistake == "cls_random")) if self.k else None
        if pos_embed == "learned" and mistake == "buffer_pos":
            self.register_buffer("pos_embed", torch.randn(1, grid * grid + self.k, dim) * 0.02)
        elif pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, grid * grid + self.k, dim) * (
                1.0 if mistake == "pos_std1" else 0.02))
        else:
            table = ref.sincos_position_embedding(grid, dim)
            rows = 1 if mistake == "sincos_zero_always" else self.k  # a zero row even without a class token
            zeros = table[:rows] if mistake == "sincos_repeat_row" else torch.zeros(rows, dim)
            table = [table, zeros] if mistake == "sincos_zero_last" else [zeros, table]
            if mistake == "sincos_param":
                self.pos_embed = nn.Parameter(torch.cat(table)[None])
            else:
                self.register_buffer("pos_embed", torch.cat(table)[None])
        rate = {"rates_depth": lambda i: drop_path * i / depth, "rates_same": lambda i: drop_path,
                "no_max": lambda i: drop_path * i / (depth - 1), "rates_shifted": lambda i: drop_path * (i + 1) / depth,
                "rates_falling": lambda i: drop_path * (depth - 1 - i) / max(depth - 1, 1),
                "rates_ignored": lambda i: 0.0}.get(mistake, lambda i: drop_path * i / max(depth - 1, 1))
        rates = [rate(i) for i in range(depth)]
        drops = (attn_drop, drop) if mistake == "drops_swapped" else (drop, attn_drop)
        if mistake == "options_ignored":  # qkv_bias and init_values not passed on
            qkv_bias, init_values = True, None
        self.blocks = nn.ModuleList(ref.EncoderBlock(dim, num_heads, mlp_ratio, qkv_bias, *drops, r, init_values)
                                    for r in rates)
        self.norm = nn.LayerNorm(dim) if mistake == "eps" else nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        if mistake == "renamed":
            self.embedding = self.patch_embed
            del self.patch_embed
        if mistake == "no_embed":  # everything in forward
            self.embed = None

    def embed(self, images):
        if self.mistake == "in_place":
            images -= images.mean()
        x = self.patch_embed(images if self.mistake == "no_stem" else self.stem(images))  # (b, N, D)
        x = x.detach() if self.mistake == "embed_detached" else x
        if self.mistake == "append":
            return torch.cat([x, self.cls_token.expand(len(x), -1, -1)], 1) + self.pos_embed
        if self.mistake == "cls_nopos":
            return torch.cat([self.cls_token.expand(len(x), -1, -1), x + self.pos_embed[:, 1:]], 1)
        x = x if self.cls_token is None else torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)
        nopos = self.mistake == "nopos" or self.mistake == "nopos_patches" and self.cls_token is None
        return x if nopos else x + self.pos_embed

    def forward(self, images):
        x = self.embed(images) if self.embed else ViTParts.embed(self, images)  # (b, n, D); no_embed: all in forward
        x = self.norm(x) if self.mistake == "norm_first" else x
        for blk in {"first_block": self.blocks[:1], "last_block": self.blocks[-1:]}.get(self.mistake, self.blocks):
            x = blk(x)
        if self.mistake not in ("nonorm", "norm_first", f"nonorm_{self.pool}"):  # nonorm_mean: with pool="mean"
            x = self.norm(x)
        pooled = {"cls": lambda: x[:, 0], "mean": lambda: x[:, self.k:].mean(1), "all": lambda: x.mean(1),
                  "last": lambda: x[:, -1], "skip1": lambda: x[:, 1:].mean(1)}[self.reads.get(self.pool, self.pool)]
        return self.head(pooled())


def vit_with(mistake=None, **reads):
    """The ViT of a slip: ``mistake``, a knob of ViTParts; ``reads``, pool -> what the head reads instead."""
    return type("ViT", (ViTParts,), {"mistake": mistake, "reads": reads})


def given(image_size, in_channels, stem_channels):
    """What the stub's given lines compute: the stem's parameters, then the channels and size patches are cut from."""
    channels, (height, width), stem = in_channels, ref.to_pair(image_size), 0
    for c_out in stem_channels or ():
        stem += 9 * channels * c_out + 2 * c_out
        channels, height, width = c_out, (height + 1) // 2, (width + 1) // 2
    return stem, channels, height, width


def count(*slips):
    """count_parameters by formula, with ``slips``: the parts it leaves out (the keys of ``block`` and ``parts``
    below), or "in_channels" and "image_size" (the patches cut from the image, not from the stem's output), "square"
    (N from the height alone), "mlp_ratio" (hidden = 4 * dim, whatever mlp_ratio), "once" (one block counted) and
    the options it ignores: "pos_embed_ignored", "class_token_ignored", "qkv_bias_ignored" (counted as if learned,
    not given, True) and "pool_ignored" (a class token whatever pool)."""
    def count_parameters(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                         pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None,
                         stem_channels=None, **_):
        class_token = None if "class_token_ignored" in slips else True if "pool_ignored" in slips else class_token
        k = int(pool == "cls" if class_token is None else class_token)
        stem, channels, height, width = given(image_size, in_channels, stem_channels)
        channels = in_channels if "in_channels" in slips else channels
        height, width = ref.to_pair(image_size) if "image_size" in slips else (height, width)
        n = (height // patch_size) * ((height if "square" in slips else width) // patch_size)
        hidden = 4 * dim if "mlp_ratio" in slips else int(dim * mlp_ratio)
        learned = pos_embed == "learned" or "pos_embed_ignored" in slips
        qkv_bias = qkv_bias or "qkv_bias_ignored" in slips
        block = dict(norm_weights=2 * dim, norm_biases=2 * dim, qkv=3 * dim * dim, qkv_bias=3 * dim * qkv_bias,
                     proj=dim * dim, proj_bias=dim, fc1=dim * hidden, fc1_bias=hidden, fc2=hidden * dim, fc2_bias=dim,
                     layerscale=2 * dim * bool(init_values))
        parts = dict(stem=stem, patch=patch_size ** 2 * channels * dim, patch_bias=dim, cls_token=k * dim,
                     cls_row=k * dim * learned, positions=n * dim * learned,
                     blocks=(1 if "once" in slips else depth) * kept(block), norm=dim, norm_bias=dim,
                     head=dim * num_classes, head_bias=num_classes)
        return kept(parts)

    def kept(parts):
        return sum(size for part, size in parts.items() if part not in slips)
    return count_parameters


def count_by_layers(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                    pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None,
                    stem_channels=None):
    linear = lambda i, o, bias=True: i * o + o * bias  # noqa: E731
    k = int(pool == "cls" if class_token is None else class_token)
    stem, in_channels, height, width = given(image_size, in_channels, stem_channels)
    hidden, n = int(dim * mlp_ratio), (height // patch_size) * (width // patch_size)
    block = (2 * 2 * dim + linear(dim, 3 * dim, qkv_bias) + linear(dim, dim) + linear(dim, hidden)
             + linear(hidden, dim) + (2 * dim if init_values else 0))
    positions = (n + k) * dim if pos_embed == "learned" else 0
    return stem + linear(patch_size ** 2 * in_channels, dim) + k * dim + positions + depth * block + 2 * dim + linear(
        dim, num_classes)


SLIPS = [Slip("ViT", name, rule, hint, impl) for name, rule, hint, impl in [
    ("renamed", "names", "the patch embedding is `patch_embed` (a PatchEmbedding with a Linear `proj`)",
     vit_with("renamed")),
    ("no_grid", "attributes", "self.grid_size = self.patch_embed.grid_size", vit_with("no_grid")),
    ("no_embed", "embed", "write embed(images) -> (b, n, D) as the exercise asks", vit_with("no_embed")),
    ("appended", "embed", VIT_APPENDED, vit_with("append")),
    ("no_norm", "output", "the final LayerNorm `norm` is not applied before the head", vit_with("nonorm")),
    ("first_block", "output", VIT_FIRST_BLOCK, vit_with("first_block")),
    ("no_stem", "embed", "embed skips the stem: tokens = self.patch_embed(self.stem(images)) (the stem is "
     "nn.Identity() for a plain ViT)", vit_with("no_stem")),
    ("pe_image_size", "names", "the patches are cut from the stem's output: PatchEmbedding(token_image, patch_size, "
     "token_channels, dim), the given lines set both", vit_with("pe_image_size")),
    ("torch_default", "eps", "norm = nn.LayerNorm(dim, eps=1e-6): PyTorch's default eps is 1e-5, ViT's (and timm's) "
     "1e-6", vit_with("eps")),
    ("drops_swapped", "blocks", "EncoderBlock(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, rate, "
     "init_values): the arguments in the statement's order (or by name, drop=drop, attn_drop=attn_drop)",
     vit_with("drops_swapped")),
    ("cls_random", "initial", "nn.Parameter(torch.zeros(1, 1, dim))", vit_with("cls_random")),
    ("parameter", "sincos", "the sin-cos table is fixed, not learned: store it with self.register_buffer('pos_embed', "
     "table)", vit_with("sincos_param")),
    ("mean_all", "pool", "mean pooling averages the class token in with the patches: average the patch tokens "
     "only, x[:, num_prefix_tokens:] (pool_tokens(x, self.pool, self.num_prefix_tokens) does)", vit_with(mean="all")),
    ("same", "drop_path", VIT_SAME, vit_with("rates_same")),
    ("buffer_pos", "gradient", NOT_TRAINED, vit_with("buffer_pos")),
    ("embed_detached", "gradient", CUT_AT, vit_with("embed_detached")),
    ("centred", "inputs", IN_PLACE, vit_with("in_place")),
    # before no_position: the same tokens without a class token, the hint that fits them
    ("no_position_patches", "embed", "the position embeddings are missing: add pos_embed to the patch tokens",
     vit_with("nopos_patches")),
    ("no_position", "embed", VIT_NO_POSITION, vit_with("nopos")),
    ("mean_head", "output", VIT_MEAN_HEAD, vit_with(cls="mean")),
    ("sincos_zero_last", "sincos", VIT_ZERO_ROW_FIRST, vit_with("sincos_zero_last")),
    ("sincos_zero_always", "sincos", VIT_NO_ZERO_ROW, vit_with("sincos_zero_always")),
    ("options_ignored", "names", "qkv_bias=False: pass qkv_bias on to every EncoderBlock", vit_with("options_ignored")),
    ("cls_always", "sincos", VIT_NO_ZERO_ROW, vit_with("cls_always")),
    ("rates_by_depth", "drop_path", "the rates rise to drop_path * (depth - 1) / depth only: divide by depth - 1, "
     "drop_path * i / max(depth - 1, 1), so the last block gets drop_path itself", vit_with("rates_depth")),
    ("no_max", "output", known("division by zero"), vit_with("no_max")),
    ("pos_std1", "initial", "nn.Parameter(torch.randn(1, n, dim) * 0.02)", vit_with("pos_std1")),
    ("last_block", "output", "only the last block is applied: run every block in turn, `for block in self.blocks: x = "
     "block(x)`", vit_with("last_block")),
    ("norm_first", "output", "the final norm is applied before the blocks: blocks first, then `self.norm`, then "
     "pooling", vit_with("norm_first")),
    ("last_token", "output", "the head reads the last token: the class token is token 0, x[:, 0] (pool_tokens does "
     "it)", vit_with(cls="last")),
    ("all_tokens", "output", "the head reads the mean of all tokens: read the class token's final state, x[:, 0]",
     vit_with(cls="all")),
    ("mean_reads_cls", "pool", "pool='mean' reads the class token: average the patch tokens, x[:, "
     "num_prefix_tokens:].mean(1)", vit_with(mean="cls")),
    ("mean_skips_1", "pool", "the mean leaves out token 0, a patch token here (there is no class token): average "
     "x[:, num_prefix_tokens:]", vit_with(mean="skip1")),
    ("no_norm_mean", "pool", "the final LayerNorm `norm` is not applied before pooling", vit_with("nonorm_mean")),
    ("cls_no_position", "embed", VIT_CLS_NO_POSITION, vit_with("cls_nopos")),
    ("appended_last", "embed", VIT_APPENDED, vit_with("append", cls="last")),
    ("no_position_last", "embed", VIT_NO_POSITION, vit_with("nopos", cls="last")),
    ("cls_no_position_last", "embed", VIT_CLS_NO_POSITION, vit_with("cls_nopos", cls="last")),
    ("sincos_repeat_row", "sincos", "the class token's row repeats a patch's row: it is a row of zeros, "
     "torch.cat([torch.zeros(k, dim), table])[None]", vit_with("sincos_repeat_row")),
    ("rates_shifted", "drop_path", "the first block should get 0 and the last drop_path: drop_path * i / max(depth - "
     "1, 1)", vit_with("rates_shifted")),
    ("rates_falling", "drop_path", "the rates fall with depth: the first block gets 0, the last drop_path",
     vit_with("rates_falling")),
    ("rates_ignored", "drop_path", "drop_path seems ignored: give block i the rate drop_path * i / max(depth - 1, 1), "
     "EncoderBlock(..., drop_path=rate)", vit_with("rates_ignored")),
]]
HINT = {s.name: s for s in SLIPS if s.exercise == "ViT"}  # the slips the ViT check names directly
BLOCK_BIASES = ("qkv_bias", "proj_bias", "fc1_bias", "fc2_bias")
SLIPS += [Slip("count_parameters", name, "output", hint, count(*slips)) for name, hint, slips in [
    ("square_n", "N counts the patches of a square: N = (height / P) * (width / P)", ["square"]),
    ("no_stem", "the stem's parameters are not counted: add `stem`, as the given lines compute it", ["stem"]),
    ("in_channels_after_stem", "after the stem the patches are cut from its output: use `channels` (the stem's last "
     "width), not in_channels", ["in_channels"]),
    ("image_size_after_stem", "after the stem the patches are cut from its smaller map: count N from `height` and "
     "`width`, not image_size", ["image_size"]),
    ("sincos_counted", "a sin-cos position table is a buffer, not a parameter: count the (N + 1) x D table only for "
     "pos_embed='learned'", ["pos_embed_ignored"]),
    ("mean_cls", "with pool='mean' there is no class token unless class_token=True (it defaults to pool == 'cls'): "
     "no cls_token, and no position row for it", ["pool_ignored"]),
    ("class_token_mean", "class_token=True adds a class token even with pool='mean': cls_token (D) and its position "
     "row", ["class_token_ignored"]),
    ("qkv_bias", "qkv_bias=False: the qkv layers have no bias (3D fewer per block)", ["qkv_bias_ignored"]),
    ("layerscale", "with init_values set every block has two LayerScales, ls1.gamma and ls2.gamma (D each)",
     ["layerscale"]),
    ("no_cls_token", "the class token (1 x D) is not counted, or its row of the position table ((N + 1) x D)",
     ["cls_token"]),
    ("no_positions", "the position embeddings ((N + 1) x D) are not counted", ["positions", "cls_row"]),
    ("no_cls", "the class token and its position row are both missing", ["cls_token", "cls_row"]),
    ("patch_bias", "the patch projection's bias (D) is not counted", ["patch_bias"]),
    ("no_patch_projection", "the patch projection (P*P*C x D weights + D biases) is not counted",
     ["patch", "patch_bias"]),
    ("no_block_biases", "the biases of the blocks' Linear layers are not counted (qkv 3D, proj D, fc1 hidden, fc2 D "
     "per block)", BLOCK_BIASES),
    ("no_biases", "the biases are not counted (patch projection D; qkv 3D, proj D, fc1 hidden, fc2 D per block)",
     ["patch_bias", *BLOCK_BIASES]),
    ("no_biases_at_all", "the biases are not counted (patch projection D; qkv 3D, proj D, fc1 hidden, fc2 D per "
     "block; head)", ["patch_bias", *BLOCK_BIASES, "head_bias"]),
    ("no_qkv_bias", "the qkv bias (3D per block) is not counted", ["qkv_bias"]),
    ("no_mlp_biases", "the MLP's biases (fc1 hidden, fc2 D per block) are not counted", ["fc1_bias", "fc2_bias"]),
    ("no_block_norms", "the LayerNorms (2 x 2D per block) are not counted", ["norm_weights", "norm_biases"]),
    ("no_norms", "the LayerNorms are not counted (2 x 2D per block, plus 2D for the final norm)",
     ["norm_weights", "norm_biases", "norm", "norm_bias"]),
    ("final_norm", "the final LayerNorm (2D) is not counted", ["norm", "norm_bias"]),
    ("norm_weights_only", "the LayerNorms are counted with weights only (D each, no bias)",
     ["norm_biases", "norm_bias"]),
    ("no_head", "the head (D x classes + classes) is not counted", ["head", "head_bias"]),
    ("no_head_bias", "the head's bias is not counted", ["head_bias"]),
    ("no_proj", "the attention output projection proj (D x D + D per block) is not counted", ["proj", "proj_bias"]),
    ("blocks_once", "every block's parameters are counted once only: multiply by depth", ["once"]),
    ("mlp_ratio_ignored", "the MLP width ignores mlp_ratio: hidden = int(dim * mlp_ratio)", ["mlp_ratio"]),
]] + [Slip("count_parameters", name, rule, hint, impl) for name, rule, hint, impl in [
    ("float", "int", VIT_FLOAT, lambda **cfg: float(ref.count_parameters(**cfg))),
    ("built", "formula", VIT_BUILT, lambda **cfg: sum(p.numel() for p in ref.ViT(**cfg).parameters())),
    ("nan", "output", NAN, lambda **cfg: float("nan")),
    ("tensor", "output", PLAIN_NUMBER, lambda **cfg: torch.tensor(5)),
]]


VARIANTS = [Variant(exercise, name, impl) for exercise, name, impl in [
    ("ViT", "reference_vit", ref.ViT),
    ("ViT", "vitparts", ViTParts),
    ("count_parameters", "reference_count_parameters", ref.count_parameters),
    ("count_parameters", "count", count()),
    ("count_parameters", "count_by_layers", count_by_layers),
]]
