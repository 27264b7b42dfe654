"""Chapter 05's checks (ViT, count_parameters) catch the usual mistakes and accept correct variants."""

import pytest
import torch
from torch import nn

import vit_course as ref
from vit_course import checks, pool_tokens
from vit_course.checks.ch04_patch_embeddings import PatchEmbeddingConv
from vit_course.hybrid import hybrid_stem
from vit_course.patches import to_pair

from .check_helpers import accepts, rejects, slip


class ViTParts(nn.Module):
    """A ViT from the learner's parts: Conv2d patch embedding, own loop (a correct alternative)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                 pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, stem_channels=None, stem_pool=True,
                 drop=0.0, attn_drop=0.0, drop_path=0.0, init_values=None, mistake=None):
        super().__init__()
        self.stem, size, channels = hybrid_stem(in_channels, stem_channels, to_pair(image_size), stem_pool)
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
            table = ref.patches.sincos_position_embedding(grid, dim)
            rows = 1 if mistake == "sincos_zero_always" else self.k  # a zero row even without a class token
            zeros = torch.zeros(rows, dim)
            table = [table, zeros] if mistake == "sincos_zero_last" else [zeros, table]
            if mistake == "sincos_param":
                self.pos_embed = nn.Parameter(torch.cat(table)[None])
            else:
                self.register_buffer("pos_embed", torch.cat(table)[None])
        rate = {"rates_depth": lambda i: drop_path * i / depth, "rates_same": lambda i: drop_path,
                "no_max": lambda i: drop_path * i / (depth - 1)}.get(
            mistake, lambda i: drop_path * i / max(depth - 1, 1))
        rates = [rate(i) for i in range(depth)]
        drops = (attn_drop, drop) if mistake == "drops_swapped" else (drop, attn_drop)
        if mistake == "options_ignored":  # qkv_bias and init_values not passed on
            qkv_bias, init_values = True, None
        self.blocks = nn.ModuleList(ref.EncoderBlock(dim, num_heads, mlp_ratio, qkv_bias, *drops, r, init_values)
                                    for r in rates)
        self.norm = nn.LayerNorm(dim) if mistake == "eps" else nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        self.mistake = mistake

    def embed(self, images):
        if self.mistake == "in_place":
            images -= images.mean()
        x = self.patch_embed(images if self.mistake == "no_stem" else self.stem(images))  # (b, N, D)
        x = x.detach() if self.mistake == "embed_detached" else x
        if self.mistake == "append":
            return torch.cat([x, self.cls_token.expand(len(x), -1, -1)], 1) + self.pos_embed
        x = x if self.cls_token is None else torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)
        return x if self.mistake == "nopos" else x + self.pos_embed

    def forward(self, images):
        x = self.embed(images)  # (b, n, D)
        for blk in self.blocks[:1] if self.mistake == "first_block" else self.blocks:
            x = blk(x)
        x = x if self.mistake == "nonorm" else self.norm(x)
        pooled = x[:, 0 if self.mistake == "mean_all" else self.k:].mean(1) if self.pool == "mean" else x[:, 0]
        return self.head(x[:, 1:].mean(1) if self.mistake == "mean" else pooled)


def vit_with(mistake):
    return type("ViT", (ViTParts,), {"__init__": lambda self, *a, **k: ViTParts.__init__(self, *a, **k,
                                                                                          mistake=mistake)})


@pytest.mark.parametrize("impl", [ref.ViT, ViTParts])
def test_vit_accepts(impl, capsys):
    accepts(checks.ViT, impl, capsys)


class ViTRenamed(ViTParts):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.embedding = self.patch_embed
        del self.patch_embed

    def embed(self, images):
        x = self.embedding(images)
        return x if self.cls_token is None else torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + \
            self.pos_embed


class ViTInlineEmbed(ViTParts):
    """Everything in forward, no embed method."""

    def __getattribute__(self, name):
        if name == "embed":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def forward(self, images):
        x = ViTParts.embed(self, images)
        for blk in self.blocks[:1] if self.mistake == "first_block" else self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0] if self.pool == "cls" else self.norm(x)[:, self.k:].mean(1))


def test_pool_tokens_reference_rejects_bad_pool():
    with pytest.raises(ValueError, match="'max'"):
        pool_tokens(torch.zeros(1, 3, 2), "max")
    with pytest.raises(ValueError, match="class token"):
        pool_tokens(torch.zeros(1, 3, 2), "cls", 0)


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("ViT", "names", "renamed", ViTRenamed, r"missing \['patch_embed.proj.weight'"),
    slip("ViT", "attributes", "no_grid", vit_with("no_grid"), r"grid_size should be \(3, 3\), got None"),
    slip("ViT", "embed", "no_embed", ViTInlineEmbed, "has no method embed"),
    slip("ViT", "embed", "appended", vit_with("append"), r"tokens from embed\(images\)(.|\n)*appended"),
    slip("ViT", "output", "no_norm", vit_with("nonorm"), "final LayerNorm"),
    slip("ViT", "output", "first_block", vit_with("first_block"), "only the first block is applied"),
    slip("ViT", "embed", "no_stem", vit_with("no_stem"), r"raised ValueError(.|\n)*embed skips the stem"),
    slip("ViT", "names", "pe_image_size", vit_with("pe_image_size"),
         r"patch_embed is built for images of size \(16, 16\) with 3 channels(.|\n)*PatchEmbedding\(token_image"),
    slip("ViT", "eps", "torch_default", vit_with("eps"), r"norm.eps is 1e-05, the statement's is 1e-6"),
    slip("ViT", "blocks", "drops_swapped", vit_with("drops_swapped"),
         r"missing: 3 x attn_drop=0.3 on the attention weights(.|\n)*in the statement's order"),
    slip("ViT", "initial", "cls_random", vit_with("cls_random"), "cls_token should be zeros"),
    slip("ViT", "sincos", "parameter", vit_with("sincos_param"), "register_buffer"),
    slip("ViT", "pool", "mean_all", vit_with("mean_all"), "mean pooling averages the class token in"),
    slip("ViT", "drop_path", "same", vit_with("rates_same"), "every block gets the same rate"),
    slip("ViT", "gradient", "buffer_pos", vit_with("buffer_pos"), r"`pos_embed` is not a trainable parameter(.|\n)*"
         r"nn.Parameter"),
    slip("ViT", "gradient", "embed_detached", vit_with("embed_detached"),
         r"no gradient reaches `patch_embed.proj.weight`(.|\n)*x.detach\(\)"),
    slip("ViT", "inputs", "centred", vit_with("in_place"), "changed its input `images` in place"),
]


def given(image_size, in_channels, stem_channels):
    """What the stub's given lines compute: the stem's parameters, then the channels and size patches are cut from."""
    channels, (height, width), stem = in_channels, to_pair(image_size), 0
    for c_out in stem_channels or ():
        stem += 9 * channels * c_out + 2 * c_out
        channels, height, width = c_out, (height + 1) // 2, (width + 1) // 2
    return stem, channels, height, width


def count(cls_token=True, biases=True, norms=True, head_bias=True, stem_slip=None, final_norm=True, patch_bias=True):
    def count_parameters(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                         pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None,
                         stem_channels=None, **_):
        k = int(pool == "cls" if class_token is None else class_token) if cls_token else 0
        stem, channels, height, width = given(image_size, in_channels, stem_channels)
        stem = 0 if stem_slip == "no_stem" else stem
        channels = in_channels if stem_slip == "in_channels" else channels
        height, width = to_pair(image_size) if stem_slip == "image_size" else (height, width)
        hidden = int(dim * mlp_ratio)
        n = (height // patch_size) ** 2 if stem_slip == "square" else (height // patch_size) * (width // patch_size)
        block = (4 * dim * dim + 2 * dim * hidden + biases * (2 * dim + qkv_bias * 3 * dim + hidden) + norms * 4 * dim
                 + 2 * dim * bool(init_values))
        return (stem + patch_size ** 2 * channels * dim + biases * patch_bias * dim + k * dim
                + (n + k) * dim * (pos_embed == "learned") + depth * block + norms * final_norm * 2 * dim
                + dim * num_classes
                + head_bias * num_classes)
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


@pytest.mark.parametrize("impl, hint", [(count(final_norm=False), "the final LayerNorm"),
                                        (count(patch_bias=False), "the patch projection's bias")])
def test_count_parameters_names_every_slip_that_leaves_out_as_many(impl, hint):
    """The final norm (2D) leaves out as much as the class token with its position row, the patch projection's
    bias (D) as much as the class token alone: the hint names each candidate, not only the first."""
    rejects(checks.count_parameters, impl, f"one of these(.|\\n)*{hint}")


@pytest.mark.parametrize("impl", [ref.count_parameters, count(), count_by_layers])
def test_count_parameters_accepts(impl, capsys):
    accepts(checks.count_parameters, impl, capsys)


def count_float(**cfg):
    return float(ref.count_parameters(**cfg))


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS += [
    slip("count_parameters", "output", "no_cls", count(cls_token=False), "class token"),
    slip("count_parameters", "int", "float", count_float, "the count should be an int, got float"),
    slip("count_parameters", "formula", "built", lambda **cfg: sum(p.numel() for p in ref.ViT(**cfg).parameters()),
         r"your count called torch \d+ times for ViT-B/16(.|\n)*count by formula"),
    slip("count_parameters", "output", "no_stem", count(stem_slip="no_stem"), "the stem's parameters are not counted"),
    slip("count_parameters", "output", "in_channels_after_stem", count(stem_slip="in_channels"),
         r"use `channels` \(the stem's last width\), not in_channels"),
    slip("count_parameters", "output", "image_size_after_stem", count(stem_slip="image_size"),
         "count N from `height` and `width`, not image_size"),
    slip("count_parameters", "output", "square_n", count(stem_slip="square"), "N counts the patches of a square"),
]


# folded from the parametrized tests: each rejected under the rule the check blames
SLIPS += [
    slip("ViT", "embed", "vit_rejects_1", vit_with("nopos"), "position embeddings are missing"),
    slip("ViT", "output", "vit_rejects_3", vit_with("mean"), "mean of the patch tokens"),
    slip("ViT", "sincos", "vit_rejects_more_1", vit_with("sincos_zero_last"),
         "the class token's zero row goes in front"),
    slip("ViT", "sincos", "vit_rejects_more_2", vit_with("sincos_zero_always"),
         r"with pool='mean' and class_token=None there is no class token, so no zero row"),
    slip("ViT", "names", "vit_rejects_more_3", vit_with("options_ignored"),
         "qkv_bias=False: pass qkv_bias on to every EncoderBlock"),
    slip("ViT", "sincos", "vit_rejects_more_5", vit_with("cls_always"),
         "with pool='mean' and class_token=None there is no class token"),
    slip("ViT", "drop_path", "vit_rejects_more_6", vit_with("rates_depth"),
         r"drop-path rates are \[0.0, 0.075, 0.15, 0.225\], expected \[0.0, 0.1, 0.2, 0.3\](.|\n)*"
                    r"divide by depth - 1"),
    slip("ViT", "output", "vit_rejects_more_8", vit_with("no_max"), "raised ZeroDivisionError"),
    slip("ViT", "initial", "vit_rejects_more_10", vit_with("pos_std1"),
         r"pos_embed should be small random numbers \(std 0.02\)"),
    slip("count_parameters", "output", "count_parameters_rejects_1", count(biases=False), "biases"),
    slip("count_parameters", "output", "count_parameters_rejects_2", count(norms=False), "LayerNorms"),
    slip("count_parameters", "output", "count_parameters_rejects_3", count(head_bias=False), "head's bias"),
    slip("count_parameters", "output", "count_parameters_rejects_4", lambda **cfg: float("nan"), "is nan"),
    slip("count_parameters", "output", "count_parameters_rejects_5", lambda **cfg: torch.tensor(5), r"\.item\(\)"),
    slip("count_parameters", "output", "count_parameters_rejects_more_0",
         lambda **cfg: count()(**{**cfg, "pos_embed": "learned"}),
         "a sin-cos position table is a buffer"),
    slip("count_parameters", "output", "count_parameters_rejects_more_1",
         lambda **cfg: count()(**{**cfg, "class_token": True}),
         "with pool='mean' there is no class token unless"),
    slip("count_parameters", "output", "count_parameters_rejects_more_2",
         lambda **cfg: count()(**{**cfg, "class_token": None}),
         "class_token=True adds a class token"),
    slip("count_parameters", "output", "count_parameters_rejects_more_3",
         lambda **cfg: count()(**{**cfg, "qkv_bias": True}),
         "qkv_bias=False: the qkv layers have no bias"),
    slip("count_parameters", "output", "count_parameters_rejects_more_4",
         lambda **cfg: count()(**{**cfg, "init_values": None}),
         "two LayerScales"),
]
