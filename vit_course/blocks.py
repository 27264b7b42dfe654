"""The Transformer encoder block and its parts (chapter 03).

A pre-norm block, as in ViT:  x = x + attn(norm1(x));  x = x + mlp(norm2(x)).
Names follow timm's ``Block`` so its weights load unchanged.
"""

import torch
from torch import nn

from .attention import MultiHeadAttention


class MLP(nn.Module):
    """Linear(D -> D_mlp) -> exact GELU -> Linear(D_mlp -> D), applied to each token alone (dim = D, hidden_dim =
    D_mlp); dropout with rate ``drop`` after the GELU and after fc2. forward(x (..., D)) -> (..., D)
    """

    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()  # exact (erf) GELU, as in timm
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class LayerNorm(nn.Module):
    """LayerNorm written out (the optional exercise of chapter 03); equals ``nn.LayerNorm`` with the same eps.

    Each token is shifted to mean 0 and scaled to variance 1 over its own features,
    then scaled by ``weight`` and shifted by ``bias``. forward(x (..., dim)) -> (..., dim)
    """

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)  # (..., 1)
        var = x.var(-1, unbiased=False, keepdim=True)  # (..., 1): the biased variance, as nn.LayerNorm
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class DropPath(nn.Module):
    """Stochastic depth: drop a sample's whole residual branch with probability p.

    Survivors are scaled by 1/(1-p) so the expected output is unchanged; at eval time it
    is the identity. forward(x (b, ...)) -> (b, ...)
    """

    def __init__(self, p=0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop-path probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (b, 1, 1)
        return x * mask / keep

    def extra_repr(self):
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel learnable scale on a residual branch (CaiT), started small."""

    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block with timm's names.

    Args:
        dim: token width D, kept constant so the residual additions line up
        num_heads: attention heads (dim must be divisible by it)
        mlp_ratio: the MLP's hidden width D_mlp is int(dim * mlp_ratio)
        drop: dropout after the attention projection and in the MLP
        drop_path: stochastic-depth probability of each residual branch (0 = off)
        init_values: LayerScale initial value (None = off)
    Attributes: norm1, attn, norm2, mlp, and per branch ls1/ls2 and drop_path1/drop_path2 (identities when off).
    forward(x (b, n, D), mask=None) -> (b, n, D). The attention weights of a block are
    ``block.attn.attention_weights(block.norm1(x))``.
    """

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0,
                 drop_path=0.0, init_values=None):
        super().__init__()
        # given: the options that scale (LayerScale) and drop (DropPath) each residual branch; identities when off
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLP(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))  # (b, n, D)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # (b, n, D)
