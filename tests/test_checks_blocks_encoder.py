"""The check of vit_course/checks/blocks_encoder.py (chapter 03: EncoderBlock) catches the usual mistakes and
accepts correct variants.
"""

import pytest
import torch
from torch import nn

import vit_course as ref
from vit_course import MLP, MultiHeadAttention, checks

from .check_helpers import accepts, rejects, slip
from .test_checks_blocks import DropPathTimm


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
        if kind == "parallel":
            return x + attn(self.norm1(x)) + self.mlp(self.norm2(x))
        x = x + self.drop_path1(self.ls1(attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
    return type("EncoderBlock", (ref.EncoderBlock,), dict(forward=forward))


class BlockOwnParts(nn.Module):
    """A block from the learner's own parts (torch's LayerNorm with the statement's eps, timm-style DropPath)."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = ref.MultiHeadAttention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.mlp = ref.MLP(dim, int(dim * mlp_ratio), drop)
        self.ls1, self.ls2 = (ref.LayerScale(dim, init_values) if init_values else nn.Identity() for _ in range(2))
        self.drop_path1, self.drop_path2 = (DropPathTimm(drop_path) for _ in range(2))

    def forward(self, x, mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


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


class BlockSlip(ref.EncoderBlock):
    """The reference block with one slip."""

    slip = None

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        ignore = {"qkv_bias": dict(qkv_bias=True), "init_values": dict(init_values=None),
                  "drop_path": dict(drop_path=0.0)}.get(self.slip, {})
        options = dict(qkv_bias=qkv_bias, drop=drop, attn_drop=attn_drop, drop_path=drop_path,
                       init_values=init_values) | ignore
        super().__init__(dim, num_heads, mlp_ratio, **options)
        self.rate = drop_path

    def forward(self, x, mask=None):
        ls1, ls2 = (self.ls2, self.ls1) if self.slip == "swap_ls" else (self.ls1, self.ls2)
        ls1, ls2 = (nn.Identity(), nn.Identity()) if self.slip == "no_ls" else (ls1, ls2)
        if self.slip == "around_sum":
            x = self.drop_path1(x + ls1(self.attn(self.norm1(x), mask=mask)))
            return self.drop_path2(x + ls2(self.mlp(self.norm2(x))))
        if self.slip == "eval_drop_path":
            keep = (torch.rand(len(x), 1, 1) >= self.rate) / (1 - self.rate) if self.rate else 1.0
            x = x + keep * self.attn(self.norm1(x), mask=mask)
            return x + self.mlp(self.norm2(x))
        x = x + self.drop_path1(ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(ls2(self.mlp(self.norm2(x))))


def block_slip(slip):
    return type("EncoderBlock", (BlockSlip,), {"slip": slip})


@pytest.mark.parametrize("slip, hint", [
    ("qkv_bias", "qkv_bias=False seems ignored"), ("init_values", "ls1 and ls2 are LayerScale"),
    ("no_ls", "LayerScale is not applied"), ("swap_ls", "ls1 and ls2 are swapped"),
    ("around_sum", "DropPath is applied to x \\+ branch"), ("drop_path", "no residual branch was ever dropped"),
    ("eval_drop_path", "in eval mode two calls on the same input gave different outputs"),
])
def test_block_rejects_more(slip, hint):
    rejects(checks.EncoderBlock, block_slip(slip), hint)


def test_block_accepts_the_slip_free_variant(capsys):
    accepts(checks.EncoderBlock, block_slip(None), capsys)


class BlockMore(ref.EncoderBlock):
    slip = None

    def forward(self, x, mask=None):
        if self.slip == "in_place":
            x += self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        elif self.slip == "residual_detached":
            x = x.detach() + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        elif self.slip == "attn_no_grad":
            with torch.no_grad():
                branch = self.attn(self.norm1(x), mask=mask)
            x = x + self.drop_path1(self.ls1(branch))
        else:
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def block_more(slip):
    return type("EncoderBlock", (BlockMore,), {"slip": slip})


class BlockRenamed(ref.EncoderBlock):
    def __init__(self, dim, num_heads, *args, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.ln1 = self.norm1
        del self.norm1

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.mlp(self.norm2(x))


class BlockWiring(ref.EncoderBlock):
    """Built as the statement says, then one option dropped: norms with PyTorch's eps, or a rate not passed on."""

    slip = None

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, drop=0.0, attn_drop=0.0, drop_path=0.0,
                 init_values=None):
        super().__init__(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, drop_path, init_values)
        if self.slip == "eps":
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if self.slip in ("proj_drop", "attn_drop"):
            self.attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, **{
                "proj_drop": dict(attn_drop=attn_drop), "attn_drop": dict(proj_drop=drop)}[self.slip])
        if self.slip == "mlp_drop":
            self.mlp = MLP(dim, int(dim * mlp_ratio))


def block_wiring(slip):
    return type("EncoderBlock", (BlockWiring,), {"slip": slip})


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("EncoderBlock", "names", "ln1", BlockRenamed, r"missing \['norm1.weight'"),
    slip("EncoderBlock", "output", "post_norm", block("post"), "post-norm"),
    slip("EncoderBlock", "output", "no_residual", block("nores"), "residual connection around attention"),
    slip("EncoderBlock", "output", "parallel", block("parallel"), "both branches read the same x"),
    slip("EncoderBlock", "mask", "no_mask", block("nomask"), "mask seems not to reach"),
    slip("EncoderBlock", "options", "qkv_bias", block_slip("qkv_bias"), "qkv_bias=False seems ignored"),
    slip("EncoderBlock", "options", "swap_ls", block_slip("swap_ls"), "ls1 and ls2 are swapped"),
    slip("EncoderBlock", "drop_path", "around_sum", block_slip("around_sum"), r"DropPath is applied to x \+ branch"),
    slip("EncoderBlock", "drop_path", "ignored", block_slip("drop_path"), "no residual branch was ever dropped"),
    slip("EncoderBlock", "gradient", "residual_detached", block_more("residual_detached"),
         r"the gradient reaching `x` differs(.|\n)*x = x.detach\(\)"),
    slip("EncoderBlock", "gradient", "attn_no_grad", block_more("attn_no_grad"),
         r"no gradient reaches `norm1.weight`(.|\n)*torch.no_grad"),
    slip("EncoderBlock", "inputs", "plus_equals", block_more("in_place"), "changed its input `x` in place"),
    slip("EncoderBlock", "eps", "torch_default", block_wiring("eps"), r"norm1.eps is 1e-05, the statement's is 1e-6"),
    slip("EncoderBlock", "dropout", "no_proj_drop", block_wiring("proj_drop"),
         r"missing: drop=0.1 after the attention's proj \(proj_drop=drop\)"),
    slip("EncoderBlock", "dropout", "no_attn_drop", block_wiring("attn_drop"),
         r"missing: attn_drop=0.3 on the attention weights"),
    slip("EncoderBlock", "dropout", "mlp_without_drop", block_wiring("mlp_drop"),
         r"missing: .*drop=0.1 in the MLP after GELU"),
]
