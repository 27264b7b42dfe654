"""The Vision Transformer (chapter 05): embeddings -> encoder blocks -> norm -> head.

``MinimalViT`` is the paper's model and nothing more (class token, learned positions, the head on the class
token): chapter 05's first exercise. ``ViT`` is the same model with the options the course trains with (mean
pooling, sin-cos positions, stochastic depth, LayerScale, dropout, the hybrid's conv stem). Parameter names are
timm's (``patch_embed.proj``, ``cls_token``, ``pos_embed``, ``blocks.i``, ``norm``, ``head``) in both, so a
``MinimalViT`` loads the weights of a ``ViT`` with pool="cls", learned positions and no stem, and
``convert_timm_state_dict`` only has to reshape the patch projection.
"""

import torch
from torch import nn

from .blocks import EncoderBlock
from .hybrid import hybrid_stem
from .patches import (
    PatchEmbedding,
    add_class_token_and_position,
    conv_to_linear_weight,
    sincos_position_embedding,
    to_pair,
)

# The paper's configurations (Table 1) at 224 x 224 with a 1000-class head.
CONFIGS = {
    "ViT-Ti/16": dict(image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=192, depth=12, num_heads=3),
    "ViT-S/16": dict(image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=384, depth=12, num_heads=6),
    "ViT-B/16": dict(image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=768, depth=12, num_heads=12),
    "ViT-L/16": dict(image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=1024, depth=24, num_heads=16),
    "ViT-H/14": dict(image_size=224, patch_size=14, in_channels=3, num_classes=1000, dim=1280, depth=32, num_heads=16),
}


class MinimalViT(nn.Module):
    """The paper's Vision Transformer: patch embedding, class token and learned positions -> ``depth`` encoder
    blocks -> LayerNorm -> linear head on the class token.

    Args:
        image_size, patch_size, in_channels: images (b, in_channels, H, W) are cut into N = HW / P^2 patches
        num_classes: K, outputs of the head
        dim, depth, num_heads, mlp_ratio: width D, number of blocks L, heads, MLP width D_mlp = int(D * mlp_ratio)
    embed(images (b, C, H, W)) -> tokens (b, N + 1, D); forward(images) -> logits (b, K).
    """

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim)  # (b, N, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))  # (1, 1, D): starts at zero
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, dim) * 0.02)  # (1, N + 1, D)
        self.blocks = nn.ModuleList([EncoderBlock(dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        ### END SOLUTION
        self.apply(init_weights)

    def embed(self, images):
        """images (b, C, H, W) -> tokens (b, N + 1, D): the class token in front, positions added."""
        ### BEGIN SOLUTION
        tokens = self.patch_embed(images)  # (b, N, D)
        return add_class_token_and_position(tokens, self.cls_token, self.pos_embed)  # (b, N + 1, D)
        ### END SOLUTION

    def forward(self, images):
        """images (b, C, H, W) -> logits (b, K)."""
        ### BEGIN SOLUTION
        x = self.embed(images)  # (b, N + 1, D)
        for block in self.blocks:
            x = block(x)  # (b, N + 1, D)
        x = self.norm(x)  # (b, N + 1, D)
        return self.head(x[:, 0])  # (b, K): the class token's final state
        ### END SOLUTION


class ViT(nn.Module):
    """A Vision Transformer with options: ``MinimalViT`` (the defaults: pool="cls", learned positions, no stem, no
    regularisation) plus what the course's recipes use. Patch embedding -> ``depth`` blocks -> LayerNorm -> head.

    Args:
        image_size, patch_size, in_channels: images (b, in_channels, H, W) are cut into P x P patches
        num_classes: K, outputs of the head
        dim, depth, num_heads, mlp_ratio: width D, number of blocks L, heads, MLP width = int(D * mlp_ratio)
        pool: "cls" reads the class token's final state, "mean" the mean of the patch tokens
        pos_embed: "learned" (the paper's 1D table) or "sincos" (fixed 2D sin-cos)
        class_token: prepend a class token (default: only when pool == "cls")
        qkv_bias: bias in the fused qkv projection
        stem_channels: channels of the hybrid's conv stem, e.g. (32, 64); patches are then cut from its
            feature map (use patch_size 1 there)
        stem_pool: the stem halves its map by max-pooling (True) or by stride-2 convolutions (False)
        drop, attn_drop, drop_path, init_values: dropout, attention dropout, stochastic depth (rising
            linearly with depth), LayerScale initial value (None: off)
    forward(images (b, C, H, W)) -> logits (b, K). ``self.config`` holds the arguments, so a checkpoint
    can rebuild the model as ``ViT(**config)``.
    """

    def __init__(self, image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=768, depth=12,
                 num_heads=12, mlp_ratio=4.0, pool="cls", pos_embed="learned", class_token=None, qkv_bias=True,
                 stem_channels=None, stem_pool=True, drop=0.0, attn_drop=0.0, drop_path=0.0, init_values=None):
        config = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        super().__init__()
        self.config = config  # the constructor's arguments, as nanoGPT keeps its GPTConfig
        class_token = check_options(pool, pos_embed, class_token, dim, num_heads)
        self.image_size, self.in_channels, self.pool = to_pair(image_size), in_channels, pool
        self.num_prefix_tokens = int(class_token)
        self.stem, token_image, token_channels = hybrid_stem(in_channels, stem_channels, self.image_size, stem_pool)
        self.patch_embed = PatchEmbedding(token_image, patch_size, token_channels, dim)  # (b, N, D)
        self.grid_size, num_patches = self.patch_embed.grid_size, self.patch_embed.num_patches

        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        n = num_patches + self.num_prefix_tokens
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, n, dim) * 0.02)
        else:  # fixed: a buffer, not a parameter; the class token's position row is zero
            table = sincos_position_embedding(self.grid_size, dim)
            self.register_buffer("pos_embed", torch.cat([torch.zeros(self.num_prefix_tokens, dim), table])[None])
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth grows with depth
        self.blocks = nn.ModuleList([
            EncoderBlock(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, rate, init_values) for rate in rates])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        self.apply(init_weights)

    def embed(self, images):
        """images (b, C, H, W) -> tokens (b, n, D), class token and positions added."""
        check_images(images, self.in_channels, self.image_size)
        tokens = self.patch_embed(self.stem(images))  # (b, N, D); the stem is nn.Identity() unless hybrid
        return add_class_token_and_position(tokens, self.cls_token, self.pos_embed)  # (b, n, D)

    def forward(self, images):
        x = self.embed(images)  # (b, n, D)
        for block in self.blocks:
            x = block(x)  # (b, n, D)
        x = pool_tokens(self.norm(x), self.pool, self.num_prefix_tokens)  # (b, D): x[:, 0], or the patches' mean
        return self.head(x)  # (b, num_classes)


def check_options(pool, pos_embed, class_token, dim, num_heads):
    """Validate ``ViT``'s options, with errors that name the values; -> whether there is a class token."""
    if pool not in ("cls", "mean"):
        raise ValueError(f'pool must be "cls" or "mean", got {pool!r}')
    if pos_embed not in ("learned", "sincos"):
        raise ValueError(f'pos_embed must be "learned" or "sincos", got {pos_embed!r}')
    class_token = pool == "cls" if class_token is None else class_token
    if pool == "cls" and not class_token:
        raise ValueError('pool="cls" needs a class token')
    if num_heads < 1 or dim % num_heads:
        raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads} (heads: 1 or more)")
    return bool(class_token)


def check_images(images, in_channels, image_size):
    """Raise a ValueError naming both shapes unless images is (b, in_channels, H, W) at ``image_size``; a
    TypeError for integer images (raw pixels, not yet normalised)."""
    if not images.is_floating_point():
        raise TypeError(f"ViT expects float images, normalised with vit_course.normalize(images, mean, std); got "
                        f"{images.dtype} (data.load gives raw uint8 pixels)")
    expected = (in_channels, *to_pair(image_size))
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(f"ViT expects images of shape (batch, {', '.join(map(str, expected))}), "
                         f"got {tuple(images.shape)}")


def pool_tokens(x, pool="cls", num_prefix_tokens=1):
    """The image's representation from the final tokens: (b, n, D) -> (b, D).

    "cls": the class token's final state, x[:, 0]. "mean": the mean of the patch tokens only; the
    ``num_prefix_tokens`` leading (class) tokens are left out, as in timm's global average pooling.
    """
    if pool == "cls":
        if num_prefix_tokens < 1:
            raise ValueError('pool="cls" needs a class token (num_prefix_tokens >= 1), got 0')
        return x[:, 0]  # (b, D)
    if pool == "mean":
        return x[:, num_prefix_tokens:].mean(dim=1)  # (b, D)
    raise ValueError(f'pool must be "cls" or "mean", got {pool!r}')


def init_weights(module):
    """timm's initialisation of a Linear: truncated normal (std 0.02) weights, zero bias."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def count_parameters(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads=None, mlp_ratio=4.0,
                     pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, stem_channels=None,
                     init_values=None, **_):
    """Trainable parameters of ``ViT(**config)``, by formula (num_heads does not change it)."""
    class_token = pool == "cls" if class_token is None else class_token
    hidden = int(dim * mlp_ratio)
    channels, height, width = in_channels, *to_pair(image_size)
    stem = 0
    for c_out in stem_channels or ():
        stem += 9 * channels * c_out + 2 * c_out  # conv3x3 without bias + BatchNorm's scale and shift
        channels, height, width = c_out, (height + 1) // 2, (width + 1) // 2  # a stage rounds up: 7 -> 4
    num_patches = (height // patch_size) * (width // patch_size)
    patch_embed = patch_size * patch_size * channels * dim + dim
    tokens = dim * class_token + (num_patches + class_token) * dim * (pos_embed == "learned")
    block = (2 * 2 * dim  # two LayerNorms
             + 3 * dim * dim + 3 * dim * qkv_bias + dim * dim + dim  # qkv and proj
             + dim * hidden + hidden + hidden * dim + dim  # fc1 and fc2
             + 2 * dim * bool(init_values))  # LayerScale
    return stem + patch_embed + tokens + depth * block + 2 * dim + dim * num_classes + num_classes


def convert_timm_state_dict(state_dict):
    """Map a timm ``VisionTransformer`` state dict (e.g. ``vit_base_patch16_224``) onto ``ViT``.

    Everything shares timm's names except the patch projection: timm's Conv2d weight
    (D, C, P, P) becomes our Linear weight (D, P*P*C).
    """
    foreign = ("fc_norm.", "reg_token", "patch_embed.backbone", "attn_pool")
    unsupported = [k for k in state_dict if k.startswith(foreign)]
    if unsupported:
        raise ValueError(f"timm weights with {unsupported[:3]} have no counterpart in ViT (global-average "
                         f"fc_norm, register tokens, hybrid backbones and attention pooling are not supported)")
    out = dict(state_dict)
    weight = out["patch_embed.proj.weight"]
    if weight.ndim == 4:
        out["patch_embed.proj.weight"] = conv_to_linear_weight(weight)
    return out
