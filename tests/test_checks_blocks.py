"""The chapter-03 checks (MLP, LayerNorm, DropPath, EncoderBlock) reject the usual mistakes and accept variants."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects


def subclass(base, forward, name=None, **attrs):
    return type(name or base.__name__, (base,), dict(forward=forward, **attrs))


# --- MLP ---------------------------------------------------------------------------------------------------

class MLPErf(nn.Module):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(0.5 * h * (1 + torch.erf(h / math.sqrt(2))))  # exact GELU, written out


class MLPNames(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)


@pytest.mark.parametrize("impl, hint", [
    (subclass(ref.MLP, lambda self, x: self.fc2(F.relu(self.fc1(x)))), "ReLU"),
    (subclass(ref.MLP, lambda self, x: self.fc2(F.gelu(self.fc1(x), approximate="tanh"))), "tanh approximation"),
    (subclass(ref.MLP, lambda self, x: self.fc2(self.fc1(x))), "no activation"),
    (MLPNames, "fc1"),
])
def test_mlp_rejects(impl, hint):
    rejects(checks.MLP, impl, hint)


@pytest.mark.parametrize("impl", [ref.MLP, MLPErf])
def test_mlp_accepts(impl, capsys):
    accepts(checks.MLP, impl, capsys)


# --- LayerNorm ---------------------------------------------------------------------------------------------

def ln_forward(unbiased=False, eps_outside=False, affine=True, eps=None, axis=-1):
    def forward(self, x):
        e = self.eps if eps is None else eps
        mean = x.mean(axis, keepdim=True)
        if eps_outside:
            y = (x - mean) / (x.std(axis, unbiased=unbiased, keepdim=True) + e)
        else:
            y = (x - mean) / torch.sqrt(x.var(axis, unbiased=unbiased, keepdim=True) + e)
        return y * self.weight + self.bias if affine else y
    return forward


class LayerNormRsqrt(ref.LayerNorm):
    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias


class LayerNormF(ref.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class LayerNormNoParams(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()


@pytest.mark.parametrize("impl, hint", [
    (subclass(ref.LayerNorm, ln_forward(unbiased=True)), "unbiased variance"),
    (subclass(ref.LayerNorm, ln_forward(eps_outside=True)), "inside the square root"),
    (subclass(ref.LayerNorm, ln_forward(affine=False)), "weight and bias are not applied"),
    (subclass(ref.LayerNorm, ln_forward(eps=1e-5)), "eps seems ignored"),
    (subclass(ref.LayerNorm, ln_forward(axis=0)), "wrong axis"),
    (LayerNormNoParams, "`weight`"),
])
def test_layernorm_rejects(impl, hint):
    rejects(checks.LayerNorm, impl, hint)


@pytest.mark.parametrize("impl", [ref.LayerNorm, LayerNormRsqrt, LayerNormF])
def test_layernorm_accepts(impl, capsys):
    accepts(checks.LayerNorm, impl, capsys)


# --- DropPath ----------------------------------------------------------------------------------------------

class DropPathTimm(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.p = p

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        mask = (keep + torch.rand(x.shape[0], *(1,) * (x.ndim - 1), dtype=x.dtype)).floor_()  # timm's trick
        return x.div(keep) * mask


def drop(scale=lambda p: 1 / (1 - p), elementwise=False, in_eval=False, keep_is_p=False, inplace=False):
    def forward(self, x):
        if self.p == 0.0 or not (self.training or in_eval):
            return x
        keep = self.p if keep_is_p else 1 - self.p
        shape = x.shape if elementwise else (x.shape[0],) + (1,) * (x.ndim - 1)
        mask = (torch.rand(shape) < keep).float() * scale(self.p)
        return x.mul_(mask) if inplace else x * mask
    return type("DropPath", (DropPathTimm,), dict(forward=forward))


@pytest.mark.parametrize("impl, hint", [
    (drop(elementwise=True), "partly zeroed"),
    (drop(scale=lambda p: 1.0), "not scaled"),
    (drop(scale=lambda p: 1 - p), "multiplied by"),
    (drop(in_eval=True), "eval mode"),
    (drop(keep_is_p=True), "probability to drop"),
    (drop(inplace=True), "in place"),
])
def test_droppath_rejects(impl, hint):
    rejects(checks.DropPath, impl, hint)


@pytest.mark.parametrize("impl", [ref.DropPath, DropPathTimm, drop()])
def test_droppath_accepts(impl, capsys):
    accepts(checks.DropPath, impl, capsys)


# --- EncoderBlock ------------------------------------------------------------------------------------------

def block(kind):
    def forward(self, x, mask=None):
        attn = lambda y: self.attn(y, mask=None if kind == "nomask" else mask)  # noqa: E731
        if kind == "post":
            x = self.norm1(x + attn(x))
            return self.norm2(x + self.mlp(x))
        if kind == "shared":
            x = x + attn(self.norm1(x))
            return x + self.mlp(self.norm1(x))
        if kind == "nores":
            x = attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = x + attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))
    return type("EncoderBlock", (ref.EncoderBlock,), dict(forward=forward))


class BlockOwnParts(nn.Module):
    """A block from the learner's own parts, with nn.LayerNorm's default eps (1e-5): close enough."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = ref.MultiHeadAttention(dim, num_heads)
        self.mlp = ref.MLP(dim, int(dim * mlp_ratio))

    def forward(self, x, mask=None):
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


@pytest.mark.parametrize("impl, hint", [
    (block("post"), "post-norm"),
    (block("shared"), "same LayerNorm is used twice"),
    (block("nores"), "residual connection around attention"),
    (block("nomask"), "mask seems not to reach"),
])
def test_block_rejects(impl, hint):
    rejects(checks.EncoderBlock, impl, hint)


@pytest.mark.parametrize("impl", [ref.EncoderBlock, block("ok"), BlockOwnParts])
def test_block_accepts(impl, capsys):
    accepts(checks.EncoderBlock, impl, capsys)
