"""Attention, the one operation a Transformer is built around (chapters 01 and 02).

Shapes use b = batch, h = heads, n = tokens, d = width of one head, D = h * d.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v, written out in plain tensor operations.

    Args:
        q: queries, (..., n_q, d)
        k: keys, (..., n_k, d)
        v: values, (..., n_k, d_v)
        mask: optional boolean tensor broadcastable to (..., n_q, n_k); True means
            "may attend", the convention of ``F.scaled_dot_product_attention``.
    Returns:
        out: (..., n_q, d_v), each row a weighted average of the values
        weights: (..., n_q, n_k), each row sums to 1 over the keys
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same last dimension, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v need the same number of tokens, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., n_q, n_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # exp(-inf) = 0: no weight there
    weights = scores.softmax(dim=-1)  # (..., n_q, n_k), rows sum to 1
    if mask is not None:  # a query that may attend nowhere got softmax(all -inf) = 0/0 = NaN: make it 0,
        weights = weights.masked_fill(~mask, 0.0)  # as PyTorch's fused function does (other rows unchanged)
    return weights @ v, weights  # (..., n_q, d_v), (..., n_q, n_k)


class SelfAttention(nn.Module):
    """One attention head: queries, keys and values all come from the same tokens.

    Args:
        dim: width D of the input tokens (the chapter's X is n x D)
        head_dim: width d of the queries, keys and values
    forward(x (b, n, dim), mask=None) -> (b, n, head_dim); ``attention_weights`` gives the (b, n, n) weights.
    """

    def __init__(self, dim, head_dim):
        super().__init__()
        self.q = nn.Linear(dim, head_dim, bias=False)  # W_q: dim x head_dim
        self.k = nn.Linear(dim, head_dim, bias=False)  # W_k
        self.v = nn.Linear(dim, head_dim, bias=False)  # W_v

    def forward(self, x, mask=None):
        return scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[0]  # (b, n, head_dim)

    def attention_weights(self, x, mask=None):
        """x (b, n, dim) -> weights (b, n, n): how much each token attends to each other token."""
        return scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), mask)[1]


def split_heads(x, num_heads):
    """(b, n, D) -> (b, h, n, d), D = h * d: head i owns the i-th contiguous block of d features of every token."""
    if x.shape[-1] % num_heads:
        raise ValueError(f"width {x.shape[-1]} is not divisible by num_heads={num_heads}")
    return rearrange(x, "... n (h d) -> ... h n d", h=num_heads)


def merge_heads(x):
    """(b, h, n, d) -> (b, n, D), the inverse of ``split_heads``: each token's h head outputs side by side."""
    return rearrange(x, "... h n d -> ... n (h d)")


def split_is_correct(split_fn):
    """Test a candidate ``split_heads`` by what it returns, with no second copy to compare against: True when
    ``split_fn(x, num_heads)`` turns x (b, n, D) into (b, h, n, d) with tokens kept apart and head i holding the
    i-th block of d features, False at the first property it breaks."""
    b, n, h, d = 2, 5, 3, 4  # all different, so no axis can pass for another, and two images
    x = torch.arange(b * n * h * d).reshape(b, n, h * d)  # (b, n, D): every value is its own label
    out = split_fn(x, h)
    if tuple(out.shape) != (b, h, n, d):  # first, so a wrong shape is a False, not an IndexError below
        return False
    perm = torch.tensor([3, 0, 4, 1, 2])  # a shuffled token order: no token keeps its place
    if not torch.equal(split_fn(x[:, perm], h), out[:, :, perm]):  # (b, h, n, d): tokens in, tokens out
        return False
    return all(torch.equal(out[:, i], x[:, :, i * d:(i + 1) * d]) for i in range(h))  # (b, n, d): head i, block i


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with timm's names: a fused ``qkv`` and an output ``proj``.

    ``dim`` is the width D, split into ``num_heads`` heads of ``head_dim`` d = D / h. ``qkv`` (D -> 3D, with a bias
    unless ``qkv_bias=False``) is laid out [W_q; W_k; W_v] like ``nn.MultiheadAttention.in_proj_weight``, so weights
    copy across unchanged; ``proj`` (D -> D, always with a bias) is W_o.

    forward(x (b, n, D), mask=None) -> (b, n, D), through PyTorch's fused kernel, which on most inputs does not
    store the n x n weights; ``attention_weights`` computes them explicitly, (b, h, n, n), for inspection.
    """

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}: heads split the width")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def split_qkv(self, x):
        """x (b, n, D) -> q, k, v, each (b, h, n, d)."""
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected tokens of shape (batch, tokens, {self.dim}), got {tuple(x.shape)}")
        qkv = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return qkv.unbind(0)

    def forward(self, x, mask=None):
        q, k, v = self.split_qkv(x)  # each (b, h, n, d)
        p = self.attn_drop.p if self.training else 0.0  # attention dropout only while training
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (b, h, n, d)
        return self.proj_drop(self.proj(merge_heads(out)))  # (b, n, D)

    def attention_weights(self, x, mask=None):
        """x (b, n, D) -> weights (b, h, n, n), each row summing to 1 (no dropout: what the model attends to)."""
        q, k, v = self.split_qkv(x)  # each (b, h, n, d)
        return scaled_dot_product_attention(q, k, v, mask)[1]  # (b, h, n, n)


def blockwise_attention(q, k, v, block_size):
    """softmax(q k^T / sqrt(d)) v, reading the keys and values ``block_size`` at a time with an online softmax
    (FlashAttention's idea): one pass, a running max, denominator and weighted sum per query, never the (n_q, n_k)
    matrix.

    Args:
        q: (..., n_q, d) queries
        k: (..., n_k, d) keys
        v: (..., n_k, d_v) values
        block_size: keys per block (the last block may be shorter)
    Returns:
        (..., n_q, d_v)
    """
    ### BEGIN SOLUTION
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)  # (..., n_q, 1)
    denominator = torch.zeros_like(running_max)  # (..., n_q, 1): sum of exp(score - running_max)
    numerator = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)  # (..., n_q, d_v)
    for start in range(0, k.shape[-2], block_size):
        k_block = k[..., start:start + block_size, :]  # (..., B, d), B <= block_size
        v_block = v[..., start:start + block_size, :]  # (..., B, d_v)
        scores = q @ k_block.transpose(-2, -1) * scale  # (..., n_q, B)
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))  # (..., n_q, 1)
        correction = torch.exp(running_max - new_max)  # (..., n_q, 1): old sums were taken against the old max
        p = torch.exp(scores - new_max)  # (..., n_q, B), each at most 1
        denominator = denominator * correction + p.sum(dim=-1, keepdim=True)  # (..., n_q, 1)
        numerator = numerator * correction + p @ v_block  # (..., n_q, d_v)
        running_max = new_max
    return numerator / denominator  # (..., n_q, d_v)
    ### END SOLUTION
