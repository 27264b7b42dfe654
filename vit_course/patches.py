"""From images to tokens (chapter 04), and position embeddings at a new resolution (chapter 09).

An image (b, c, H, W) becomes N = (H/P)(W/P) patches, read row by row from the top-left,
each flattened to P*P*c numbers in (p1 p2 c) order, then projected to D features.
"""

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


def to_pair(size):
    """7 -> (7, 7); (28, 32) -> (28, 32)."""
    return (size, size) if isinstance(size, int) else tuple(size)


def patch_grid(image_size, patch_size):
    """The patch grid (rows, columns) of an image, with a clear error when it doesn't tile."""
    height, width = to_pair(image_size)
    if patch_size < 1 or height % patch_size or width % patch_size:
        raise ValueError(
            f"image of {height}x{width} pixels cannot be cut into {patch_size}x{patch_size} patches: "
            f"both sides must be divisible by the patch size")
    return height // patch_size, width // patch_size


def patchify(images, patch_size):
    """(b, c, H, W) -> (b, N, P*P*c), patches row by row, each flattened in (p1 p2 c) order."""
    if images.ndim != 4:
        raise ValueError(f"expected images of shape (batch, channels, height, width), got {tuple(images.shape)}")
    patch_grid(images.shape[-2:], patch_size)
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size)


def unpatchify(patches, patch_size, image_size):
    """(b, N, P*P*c) -> (b, c, H, W), the inverse of ``patchify``; image_size is H or (H, W)."""
    gh, gw = patch_grid(image_size, patch_size)
    if patches.ndim != 3 or patches.shape[1] != gh * gw or patches.shape[2] % (patch_size * patch_size):
        raise ValueError(
            f"expected patches of shape (batch, {gh * gw}, {patch_size}*{patch_size}*channels) for a "
            f"{to_pair(image_size)} image, got {tuple(patches.shape)}")
    return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", h=gh, w=gw, p1=patch_size, p2=patch_size)


def linear_to_conv_weight(weight, patch_size, in_channels):
    """A Linear weight (D, P*P*C) on patchify's output -> the Conv2d weight (D, C, P, P) that equals it."""
    return rearrange(weight, "d (p1 p2 c) -> d c p1 p2", p1=patch_size, p2=patch_size, c=in_channels)


def conv_to_linear_weight(weight):
    """A Conv2d weight (D, C, P, P) with kernel = stride = P -> the equivalent Linear weight (D, P*P*C)."""
    return rearrange(weight, "d c p1 p2 -> d (p1 p2 c)")


class PatchEmbedding(nn.Module):
    """Cut images into patches and project each to ``dim`` features with one shared Linear.

    forward(images (b, in_channels, H, W)) -> tokens (b, N, dim), N = (H/P)(W/P).
    ``to_conv()`` / ``from_conv()`` give the same map as timm's Conv2d(kernel = stride = P).
    """

    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__()
        self.image_size, self.patch_size, self.in_channels = to_pair(image_size), patch_size, in_channels
        self.grid_size = patch_grid(image_size, patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Linear(patch_size * patch_size * in_channels, dim)  # E: P*P*C -> D

    def forward(self, images):
        expected = (self.in_channels, *self.image_size)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"expected images of shape (batch, {', '.join(map(str, expected))}), "
                             f"got {tuple(images.shape)}")
        return self.proj(patchify(images, self.patch_size))  # (b, N, D)

    def to_conv(self):
        """The equivalent ``nn.Conv2d``, whose output (b, D, gh, gw) flattens to our tokens."""
        conv = nn.Conv2d(self.in_channels, self.proj.out_features, self.patch_size, stride=self.patch_size)
        with torch.no_grad():
            conv.weight.copy_(linear_to_conv_weight(self.proj.weight, self.patch_size, self.in_channels))
            conv.bias.copy_(self.proj.bias)
        return conv

    @classmethod
    def from_conv(cls, conv, image_size):
        """Build a PatchEmbedding computing the same map as ``conv`` (kernel = stride = P)."""
        patch_size = conv.kernel_size[0]
        if conv.kernel_size != (patch_size, patch_size) or conv.stride != conv.kernel_size:
            raise ValueError(f"need kernel = stride = P, got kernel {conv.kernel_size} and stride {conv.stride}")
        if conv.padding not in ((0, 0), "valid") or conv.dilation != (1, 1) or conv.groups != 1 or conv.bias is None:
            raise ValueError(f"need a plain patch conv (no padding, dilation or groups; a bias), got padding "
                             f"{conv.padding}, dilation {conv.dilation}, groups {conv.groups}, "
                             f"bias {conv.bias is not None}")
        embed = cls(image_size, patch_size, conv.in_channels, conv.out_channels)
        with torch.no_grad():
            embed.proj.weight.copy_(conv_to_linear_weight(conv.weight))
            embed.proj.bias.copy_(conv.bias)
        return embed


def add_class_token_and_position(tokens, cls_token, pos_embed):
    """Prepend the class token to every sequence, then add the position embeddings.

    Args:
        tokens: patch tokens (b, N, D)
        cls_token: (1, 1, D), or None for a model without one
        pos_embed: (1, N + 1, D), or (1, N, D) without a class token
    Returns: (b, N + 1, D) (or (b, N, D))
    """
    if cls_token is not None:
        tokens = torch.cat([cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)  # (b, N+1, D)
    if tokens.shape[1:] != pos_embed.shape[1:]:
        raise ValueError(f"position embeddings {tuple(pos_embed.shape)} don't fit tokens {tuple(tokens.shape)}")
    return tokens + pos_embed  # (b, N+1, D)


def sincos_position_embedding(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    """Fixed 2D sin-cos position embeddings (Beyer et al. 2022): (gh*gw, dim), rows first.

    A quarter of the features encode the column with sines, a quarter with cosines, and the
    same for the row, at frequencies spaced geometrically from 1 to 1/temperature. Row and column
    i sit at position start + step * i (default: i); e.g. a coarser grid's tokens at their centres
    in a finer grid's units.
    """
    gh, gw = to_pair(grid)
    if dim % 4:
        raise ValueError(f"2D sin-cos position embeddings need dim divisible by 4, got {dim}")
    rows, cols = (start + step * torch.arange(n, dtype=torch.float32) for n in (gh, gw))
    y, x = torch.meshgrid(rows, cols, indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / max(dim // 4 - 1, 1))  # (dim/4,)
    y = y.flatten()[:, None] * omega[None, :]  # (gh*gw, dim/4)
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # (gh*gw, dim)


def resample_position_embeddings(pos_embed, new_grid, num_prefix_tokens=1, old_grid=None):
    """Interpolate learned position embeddings to a new patch grid, as timm does for fine-tuning.

    The prefix (class) tokens' embeddings are kept; the patch embeddings are laid out on their
    grid (old_grid, square by default) and resized bicubically to new_grid.
    pos_embed (1, prefix + gh*gw, D) -> (1, prefix + new_gh*new_gw, D)
    """
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    n = patches.shape[1]
    if old_grid is None:
        side = round(n ** 0.5)
        if side * side != n:
            raise ValueError(f"{n} patch embeddings do not form a square grid: pass old_grid=(rows, cols)")
        old_grid = (side, side)
    old_grid, new_grid = to_pair(old_grid), to_pair(new_grid)
    if old_grid[0] * old_grid[1] != n:
        raise ValueError(f"old_grid {old_grid} holds {old_grid[0] * old_grid[1]} patches, pos_embed has {n}")
    grid = rearrange(patches, "1 (h w) d -> 1 d h w", h=old_grid[0])  # (1, D, gh, gw)
    grid = F.interpolate(grid.float(), size=new_grid, mode="bicubic", align_corners=False, antialias=True)
    patches = rearrange(grid, "1 d h w -> 1 (h w) d").to(pos_embed.dtype)  # (1, new_gh*new_gw, D)
    return torch.cat([prefix, patches], dim=1)
