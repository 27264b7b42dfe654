"""Chapter 05's exercises: MinimalViT (the paper's ViT: timm's names, embed(images), the logits of the class token
after the final norm, the initial values, no dropout; gradients reach every parameter) and count_parameters (by
formula, for every option of the course's ViT, with the hints of the usual omissions and excesses): checks and
rules."""

import functools
import numbers

import torch
from torch import nn

from .. import vit as ref
from .core import IN_PLACE, NAN, PLAIN_NUMBER, Slip, Variant, check
from .gradients import CUT_AT, NOT_TRAINED, gradient_flow
from .modules import randomize_norms
from .probes import TorchCalls

# ---- Exercise 5.1: MinimalViT
SMALL = dict(image_size=12, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2, mlp_ratio=2.0)
OTHER = dict(image_size=8, patch_size=2, in_channels=1, num_classes=3, dim=12, depth=3, num_heads=3, mlp_ratio=4.0)
NAMES = [
    ("cls_token", "the class token is a parameter `cls_token` of shape (1, 1, dim)"),
    ("pos_embed", "the position embeddings are a parameter `pos_embed` of shape (1, N + 1, dim)"),
    ("blocks", "the encoder blocks are an nn.ModuleList called `blocks`"),
    ("norm", "the final LayerNorm is `norm`"),
    ("head", "the classifier is a Linear `head` (dim -> num_classes)"),
]


def _label(config):
    return "MinimalViT(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"


def _twins(reference, config, rules, method, images):
    """(slip, thunk) pairs for ``close``: the slips of ``rules``, each built with ``config`` and the reference's
    weights, its ``method`` run on ``images``."""
    def output(slip):
        twin = slip.impl(**config).eval()
        twin.load_state_dict(reference.state_dict())
        return getattr(twin, method)(images)
    return [(s, functools.partial(output, s)) for s in SLIPS if s.exercise == "MinimalViT" and s.rule in rules]


def _compare(c, cls, config, g, gradients=False):
    """Build the learner's MinimalViT(**config), copy a randomised reference's weights in, compare embed's tokens and
    the logits."""
    reference = randomize_norms(ref.MinimalViT(**config).eval(), g)
    with torch.no_grad():  # a new class token is zero and the positions small: make them matter
        reference.cls_token.normal_(generator=g)
        reference.pos_embed.normal_(generator=g)
    model = c.load(c.build(cls, **config), reference, [("patch_embed", HINT["renamed"]), *NAMES])
    b, n, dim = 3, reference.patch_embed.num_patches, config["dim"]
    images = torch.randn(b, config["in_channels"], config["image_size"], config["image_size"], generator=g)
    label = _label(config)
    with torch.no_grad():
        c.phase("embed")
        if not callable(getattr(model, "embed", None)):
            c.fail("your MinimalViT has no method embed", HINT["no_embed"])
        c.close(c.call(model.embed, images, label=f"{label}.embed"), reference.embed(images),
                "tokens from embed(images)", _twins(reference, config, ["embed"], "embed", images), shape_hints=[
                    ((b, n, dim), "the class token is missing: add_class_token_and_position(tokens, self.cls_token, "
                     "self.pos_embed) puts it in front")])
        c.phase("output")
        c.close(c.call(model, images, label=label), reference(images), "logits",
                _twins(reference, config, ["output", "embed"], "forward", images), atol=1e-4, shape_hints=[
                    ((b, dim), "this is the class token's features: apply the head"),
                    ((b, n + 1, config["num_classes"]), "the head reads every token: read the class token, x[:, 0]")])
    if gradients:
        gradient_flow(c, cls, lambda _: c.call(model, images, label=label), lambda _: reference(images), {}, model,
                      reference, what="the logits")


@check("MinimalViT")
def MinimalViT(c, cls):
    """MinimalViT(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio) -> logits:
    timm's names, embed(images), the class token's logits after the final norm, the initial values, eps 1e-6, no
    dropout; gradients reach every parameter."""
    g = torch.Generator().manual_seed(15)
    _compare(c, cls, SMALL, g, gradients=True)
    _compare(c, cls, OTHER, g)
    _initial_values(c, cls)
    c.phase("eps")
    model = c.build(cls, **SMALL)
    eps = getattr(getattr(model, "norm", None), "eps", 1e-6)
    c.ok(eps == 1e-6, f"norm.eps is {eps:g}, the statement's is 1e-6", HINT["torch_default"])
    _no_dropout(c, cls, g)


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


def _random_parts(model):
    """The model's submodules that are random in training mode: (name, module) of each dropout or drop path whose
    probability is above 0."""
    return [(name, m) for name, m in model.named_modules() if ("Drop" in type(m).__name__ and float(
        getattr(m, "p", getattr(m, "drop_prob", 0.0)) or 0.0) > 0)]


def _no_dropout(c, cls, g):
    """The minimal ViT has no dropout and no drop path: in training mode it computes what it computes in eval mode."""
    c.phase("train")
    config = dict(SMALL, depth=3)
    model = c.build(cls, **config)
    images = torch.randn(4, 3, 12, 12, generator=g)
    label = _label(config)
    with torch.no_grad():
        expected = c.call(model, images, label=label)
        model.train()
        got = [c.call(model, images, label=f"{label} in training mode") for _ in range(3)]
        model.eval()
    if all(torch.allclose(out, expected, atol=1e-6) for out in got):
        c.passed()
        return
    parts = _random_parts(model)
    shown = ", ".join(f"`{name}` ({type(m).__name__}, p={getattr(m, 'p', getattr(m, 'drop_prob', '?'))})"
                      for name, m in parts) or "none found by name"
    hint = (HINT["block_drop_path"] if parts and all(name.startswith("blocks.") for name, _ in parts) else
            HINT["position_dropout"] if parts else None)
    c.fail(f"in training mode {label} gives other logits than in eval mode: something in it is random; the "
           f"minimal ViT has no dropout. Random parts: {shown}", hint)


# the slips: the reference with one part wrong, each a class named as its mistake
class ViTPatchEmbeddingRenamed(ref.MinimalViT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.embedding = self.patch_embed  # called `embedding`: its weights are embedding.proj.*
        del self.patch_embed

    def embed(self, images):
        return ref.add_class_token_and_position(self.embedding(images), self.cls_token, self.pos_embed)


class ViTWithoutEmbed(ref.MinimalViT):
    embed = None  # everything in forward, no embed method

    def forward(self, images):
        x = ref.add_class_token_and_position(self.patch_embed(images), self.cls_token, self.pos_embed)  # (b, n, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class ViTClassTokenAppended(ref.MinimalViT):
    def embed(self, images):
        tokens = self.patch_embed(images)  # (b, N, D)
        cls = self.cls_token.expand(len(tokens), -1, -1)  # (b, 1, D)
        return torch.cat([tokens, cls], dim=1) + self.pos_embed  # the class token last


class ViTClassTokenAppendedReadLast(ViTClassTokenAppended):
    def forward(self, images):  # appended, and consistently read from the last place
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, -1])


class ViTWithoutPositions(ref.MinimalViT):
    def embed(self, images):
        tokens = self.patch_embed(images)  # (b, N, D)
        return torch.cat([self.cls_token.expand(len(tokens), -1, -1), tokens], dim=1)  # no pos_embed added


class ViTClassTokenWithoutPosition(ref.MinimalViT):
    def embed(self, images):
        tokens = self.patch_embed(images) + self.pos_embed[:, 1:]  # positions on the patches only
        return torch.cat([self.cls_token.expand(len(tokens), -1, -1), tokens], dim=1)


class ViTWithoutFinalNorm(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])  # no self.norm


class ViTNormBeforeBlocks(ref.MinimalViT):
    def forward(self, images):
        x = self.norm(self.embed(images))  # the final norm applied first
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])


class ViTFirstBlockOnly(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
            return self.head(self.norm(x)[:, 0])  # returns inside the loop, after the first block


class ViTLastBlockOnly(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            y = block(x)  # every block reads the embeddings: only the last one's output is kept
        return self.head(self.norm(y)[:, 0])


class ViTHeadOnPatchMean(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 1:].mean(dim=1))  # the mean of the patch tokens


class ViTHeadOnTokenMean(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))  # the mean of all tokens


class ViTHeadOnLastToken(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, -1])  # the last token, a patch


class ViTTorchDefaultEps(ref.MinimalViT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = nn.LayerNorm(self.norm.normalized_shape)  # eps 1e-5, PyTorch's default


class ViTClassTokenRandom(ref.MinimalViT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cls_token = nn.Parameter(torch.randn(self.cls_token.shape) * 0.02)  # drawn, not zero


class ViTPositionsStd1(ref.MinimalViT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pos_embed = nn.Parameter(torch.randn(self.pos_embed.shape))  # std 1, not 0.02


class ViTPositionsBuffer(ref.MinimalViT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        table = self.pos_embed.detach().clone()
        del self.pos_embed
        self.register_buffer("pos_embed", table)  # saved with the model, never trained


class ViTTokensDetached(ref.MinimalViT):
    def forward(self, images):
        x = self.embed(images).detach()  # (b, N + 1, D), cut from the graph of the embeddings
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class ViTPositionDropout(ref.MinimalViT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pos_drop = nn.Dropout(0.1)  # timm's pos_drop: an option, not part of the minimal ViT

    def embed(self, images):
        return self.pos_drop(super().embed(images))


class ViTBlocksWithDropPath(ref.MinimalViT):
    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0):
        super().__init__(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio)
        self.blocks = nn.ModuleList([ref.EncoderBlock(dim, num_heads, mlp_ratio, drop_path=0.1) for _ in range(depth)])


class ViTCentresInPlace(ref.MinimalViT):
    def embed(self, images):
        images -= images.mean()  # changes the caller's images
        return super().embed(images)


SLIPS = [Slip("MinimalViT", name, rule, hint, impl) for name, rule, hint, impl in [
    ("renamed", "names", "the patch embedding is `patch_embed` (a PatchEmbedding, whose Linear is `proj`)",
     ViTPatchEmbeddingRenamed),
    ("no_embed", "embed", "write embed(images) -> (b, N + 1, D) as the exercise asks: forward uses it, and so do "
     "chapter 08's tools", ViTWithoutEmbed),
    ("appended", "embed", "the class token is appended: prepend it (token 0), add_class_token_and_position does",
     ViTClassTokenAppended),
    ("appended_read_last", "embed", "the class token is appended: prepend it (token 0), add_class_token_and_position "
     "does", ViTClassTokenAppendedReadLast),
    ("no_position", "embed", "the position embeddings are missing: add pos_embed after prepending the class token",
     ViTWithoutPositions),
    ("cls_no_position", "embed", "the class token gets no position: prepend it first, then add all of pos_embed",
     ViTClassTokenWithoutPosition),
    ("no_norm", "output", "the final LayerNorm `norm` is not applied before the head", ViTWithoutFinalNorm),
    ("norm_first", "output", "the final norm is applied before the blocks: blocks first, then `self.norm`, then the "
     "class token", ViTNormBeforeBlocks),
    ("first_block", "output", "only the first block is applied: run every block in turn, each on the previous one's "
     "output", ViTFirstBlockOnly),
    ("last_block", "output", "only the last block counts: each block must read the previous block's output, "
     "`x = block(x)`", ViTLastBlockOnly),
    ("mean_head", "output", "the head reads the mean of the patch tokens (mean pooling, an option of the course's "
     "ViT): read the class token's final state, x[:, 0]", ViTHeadOnPatchMean),
    ("all_tokens", "output", "the head reads the mean of all tokens: read the class token's final state, x[:, 0]",
     ViTHeadOnTokenMean),
    ("last_token", "output", "the head reads the last token: the class token is token 0, x[:, 0]", ViTHeadOnLastToken),
    ("torch_default", "eps", "norm = nn.LayerNorm(dim, eps=1e-6): PyTorch's default eps is 1e-5, ViT's (and timm's) "
     "1e-6", ViTTorchDefaultEps),
    ("cls_random", "initial", "the class token starts at zero: nn.Parameter(torch.zeros(1, 1, dim))",
     ViTClassTokenRandom),
    ("pos_std1", "initial", "the positions start as small noise: torch.randn(1, N + 1, dim) * 0.02", ViTPositionsStd1),
    ("buffer_pos", "gradient", NOT_TRAINED, ViTPositionsBuffer),
    ("tokens_detached", "gradient", CUT_AT, ViTTokensDetached),
    ("position_dropout", "train", "a dropout after the positions (timm's pos_drop): the minimal ViT has no dropout; "
     "it is an option of the course's ViT (drop=...)", ViTPositionDropout),
    ("block_drop_path", "train", "the blocks have stochastic depth: the minimal ViT's blocks are EncoderBlock(dim, "
     "num_heads, mlp_ratio), without drop_path (an option of the course's ViT)", ViTBlocksWithDropPath),
    ("centred", "inputs", IN_PLACE, ViTCentresInPlace),
]]
HINT = {s.name: s for s in SLIPS}  # the slips the MinimalViT check names directly


# the correct implementations the statement allows
class MinimalViTTimmStyle(nn.Module):
    """timm's way: a Conv2d patch projection, blocks in an nn.Sequential, the class token concatenated by hand and
    the final norm applied to the class token alone (a LayerNorm normalises each token on its own, so norm then pick
    and pick then norm agree)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        num_patches = (image_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[ref.EncoderBlock(dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def embed(self, images):
        x = self.patch_embed.proj(images).flatten(2).transpose(1, 2)  # (b, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (b, N + 1, D)
        return x + self.pos_embed

    def forward(self, images):
        x = self.blocks(self.embed(images))  # (b, N + 1, D)
        return self.head(self.norm(x[:, 0]))  # (b, K)


class MinimalViTListComprehension(ref.MinimalViT):
    """The reference built its own way: PatchEmbedding's num_patches counted by hand, blocks from a list."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0):
        nn.Module.__init__(self)
        self.patch_embed = ref.PatchEmbedding(image_size, patch_size, in_channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, (image_size // patch_size) ** 2 + 1, dim))
        blocks = []
        for _ in range(depth):
            blocks.append(ref.EncoderBlock(dim, num_heads, mlp_ratio))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)


# ---- Exercise 5.2: count_parameters
VIT_FLOAT = "use // to count the patches (or int(...)): / always gives a float"
VIT_BUILT = ("count by formula, without building the model or any tensor: the point is to size models too big for "
             "your memory")
CONFIGS = [
    ref.CONFIGS["ViT-B/16"],
    ref.CONFIGS["ViT-Ti/16"],
    dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=64, depth=3, num_heads=4, mlp_ratio=2.0),
    dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=96, depth=5, num_heads=3, mlp_ratio=3.0),
]
OPTIONS = [dict(CONFIGS[2], **options) for options in (
    dict(pos_embed="sincos"), dict(pool="mean"), dict(pool="mean", class_token=True), dict(qkv_bias=False),
    dict(init_values=0.1), dict(init_values=0.0), dict(pool="mean", pos_embed="sincos"))]


STEMS = [  # a non-square image and hybrids, tried after the configurations above
    dict(image_size=(28, 20), patch_size=4, in_channels=3, num_classes=10, dim=32, depth=2, num_heads=2, mlp_ratio=2.0),
    dict(image_size=32, patch_size=2, in_channels=3, num_classes=10, dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
         stem_channels=(16, 32)),
    dict(image_size=(28, 36), patch_size=2, in_channels=1, num_classes=7, dim=24, depth=1, num_heads=2, mlp_ratio=2.0,
         stem_channels=(8,)),
]


def _absent(cfg):
    """What ViT(**cfg) does not build, in words: the parts a count that is too high may have added."""
    has_class_token = cfg.get("pool", "cls") == "cls" if cfg.get("class_token") is None else cfg["class_token"]
    absent = [] if has_class_token else [f"no class token and no position row for one (pool={cfg.get('pool')!r})"]
    if cfg.get("pos_embed", "learned") != "learned":
        absent.append("no position parameters (a sin-cos table is a buffer)")
    if not cfg.get("init_values"):
        absent.append(f"no LayerScale (init_values={cfg.get('init_values')!r})")
    if not cfg.get("qkv_bias", True):
        absent.append("no qkv bias (qkv_bias=False)")
    return "; ".join(absent) or "every part of this configuration is built once"


def _hint(c, cfg, expected, got):
    """The likely cause of a wrong count: the catalogue's counting slips that give the learner's count on cfg (all of
    them when several give it); else, for a count too high, what this configuration does not build. (A count too
    high is never blamed on a part left out: that names the wrong part.)"""
    same = [s for s in c.slips("output") if s.impl(**cfg) == got]
    if same:  # several slips can give the same count (D too few, D too many): name them all rather than guess one
        return same[0] if len(same) == 1 else "one of these (each gives that count): " + "; or ".join(
            s.hint for s in same)
    if got > expected:
        return (f"{got - expected:,.0f} too many: a part is counted that ViT(**config) does not build here "
                f"({_absent(cfg)})")
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
        c.ok(got == expected, f"counted {got:,.0f} parameters, expected {expected:,}: {abs(got - expected):,.0f} too "
             f"{'many' if got > expected else 'few'}",
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
    "MinimalViT": ("names", "embed", "output", "initial", "eps", "train", "gradient"),
    "count_parameters": ("output", "formula", "int"),
}


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




def count_class_token_for_mean(**config):
    """Counts a class token (D) whatever pool: with pool="mean" and class_token unset there is none."""
    right = ref.count_parameters(**config)
    has_class_token = config.get("pool", "cls") == "cls" if config.get("class_token") is None else config["class_token"]
    return right if has_class_token else right + config["dim"]


def count_position_row_without_class_token(**config):
    """Counts N + 1 rows of positions even without a class token, where the table has N."""
    right = ref.count_parameters(**config)
    has_class_token = config.get("pool", "cls") == "cls" if config.get("class_token") is None else config["class_token"]
    learned = config.get("pos_embed", "learned") == "learned"
    return right if has_class_token or not learned else right + config["dim"]


def count_layerscale_for_zero(**config):
    """Counts LayerScale whenever init_values is given (`is not None`), 0.0 included: EncoderBlock builds none for
    0.0 (`LayerScale(...) if init_values else nn.Identity()`)."""
    right = ref.count_parameters(**config)
    zero = config.get("init_values") is not None and not config["init_values"]
    return right + 2 * config["dim"] * config["depth"] if zero else right

def count_patches_from_the_image(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads=None,
                                 mlp_ratio=4.0, pool="cls", pos_embed="learned", class_token=None, qkv_bias=True,
                                 stem_channels=None, init_values=None, **_):
    """Sizes the patch projection and the patches from in_channels and image_size, not from the given lines'
    channels, height, width: right for a plain ViT, wrong after a hybrid's stem."""
    class_token = pool == "cls" if class_token is None else class_token
    hidden = int(dim * mlp_ratio)
    channels, height, width = in_channels, *ref.to_pair(image_size)
    stem = 0
    for c_out in stem_channels or ():
        stem += 9 * channels * c_out + 2 * c_out
        channels, height, width = c_out, (height + 1) // 2, (width + 1) // 2
    image_height, image_width = ref.to_pair(image_size)
    num_patches = (image_height // patch_size) * (image_width // patch_size)  # the image's patches, not the map's
    patch_embed = patch_size * patch_size * in_channels * dim + dim  # the image's channels, not the stem's
    tokens = dim * class_token + (num_patches + class_token) * dim * (pos_embed == "learned")
    block = (2 * 2 * dim + 3 * dim * dim + 3 * dim * qkv_bias + dim * dim + dim
             + dim * hidden + hidden + hidden * dim + dim + 2 * dim * bool(init_values))
    return stem + patch_embed + tokens + depth * block + 2 * dim + dim * num_classes + num_classes


VIT_STEM_OUTPUT = ("the patch projection reads the stem's output (channels, height, width of the given lines), not "
                   "in_channels and image_size")
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
    ("class_token_for_mean", "output", "with pool='mean' (class_token unset) there is no class token: its D "
     "parameters are not there", count_class_token_for_mean),
    ("position_row_without_class_token", "output", "without a class token the position table has N rows, not N + 1",
     count_position_row_without_class_token),
    ("layerscale_for_zero", "output", "init_values=0.0 builds no LayerScale (EncoderBlock tests `if init_values`, "
     "and 0.0 is false): count 2D per block only when init_values is a non-zero number",
     count_layerscale_for_zero),
    ("patches_from_the_image", "output", VIT_STEM_OUTPUT, count_patches_from_the_image),
    ("float", "int", VIT_FLOAT, lambda **cfg: float(ref.count_parameters(**cfg))),
    ("built", "formula", VIT_BUILT, lambda **cfg: sum(p.numel() for p in ref.ViT(**cfg).parameters())),
    ("nan", "output", NAN, lambda **cfg: float("nan")),
    ("tensor", "output", PLAIN_NUMBER, lambda **cfg: torch.tensor(5)),
]]


VARIANTS = [Variant(exercise, name, impl) for exercise, name, impl in [
    ("MinimalViT", "reference_minimal_vit", ref.MinimalViT),
    ("MinimalViT", "course_vit", ref.ViT),  # the course's ViT with its options at their defaults
    ("MinimalViT", "timm_style", MinimalViTTimmStyle),
    ("MinimalViT", "list_of_blocks", MinimalViTListComprehension),
    ("count_parameters", "reference_count_parameters", ref.count_parameters),
    ("count_parameters", "count", count()),
    ("count_parameters", "count_by_layers", count_by_layers),
]]
