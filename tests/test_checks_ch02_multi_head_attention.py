"""Chapter 02's checks (split_heads, merge_heads, MultiHeadAttention) catch the usual mistakes and accept
correct variants."""

import math

import pytest
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import vit_course as ref
from vit_course import checks
from vit_course.checks import CheckFailed
from vit_course.checks.ch01_self_attention import _sdpa_einsum as sdpa_einsum
from vit_course.checks.ch01_self_attention import attention as sdpa

from .check_helpers import accepts, slip


def split_view(x, h):
    b, n, _ = x.shape
    return x.view(b, h, n, -1)


def split_ok(x, h):
    b, n, width = x.shape
    if width % h:
        raise ValueError(f"{width} features cannot be split into {h} heads")
    return x.view(b, n, h, width // h).permute(0, 2, 1, 3)


def split_unflatten(x, h):
    if x.shape[-1] % h:
        raise ValueError(f"width {x.shape[-1]} is not divisible by num_heads={h}")
    return x.unflatten(-1, (h, -1)).transpose(1, 2)


@pytest.mark.parametrize("impl", [ref.split_heads, split_ok, split_unflatten])
def test_split_heads_accepts(impl, capsys):
    accepts(checks.split_heads, impl, capsys)


@pytest.mark.parametrize("impl", [ref.merge_heads, lambda x: x.transpose(1, 2).flatten(2)])
def test_merge_heads_accepts(impl, capsys):
    accepts(checks.merge_heads, impl, capsys)


class MHATimmStyle(nn.Module):
    """timm's reshape/permute style with einsum attention: a correct alternative."""

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{dim} is not divisible by {num_heads}")
        self.num_heads, self.dim, self.head_dim = num_heads, dim, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(proj_drop)

    def split_qkv(self, x):
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected (b, n, {self.dim}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        return self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x, mask=None):
        b, n, dim = x.shape
        q, k, v = self.split_qkv(x)
        out, weights = sdpa_einsum(q, k, v, mask)
        out = self.attn_drop(weights) @ v  # the explicit path's attention dropout
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, dim)))

    def attention_weights(self, x, mask=None):
        return sdpa_einsum(*self.split_qkv(x), mask)[1]


class MHAWrong(MHATimmStyle):
    mistake = None

    def forward(self, x, mask=None):
        self.split_qkv(x)  # validates x
        b, n, dim = x.shape
        h = self.num_heads
        qkv = self.qkv(x)
        if self.mistake == "view":
            q, k, v = (t.reshape(b, h, n, dim // h) for t in qkv.chunk(3, -1))
        elif self.mistake == "order":
            q, k, v = rearrange(qkv, "b n (h three d) -> three b h n d", three=3, h=h)
        else:
            q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=h)
        out, weights = sdpa(q, k, v, mask, scale=1 / math.sqrt(dim) if self.mistake == "scale" else None)
        out = self.attn_drop(weights) @ v
        out = out.reshape(b, n, dim) if self.mistake == "merge" else ref.merge_heads(out)
        return self.proj_drop(out if self.mistake == "proj" else self.proj(out))


def mha_with(mistake):
    return type("MultiHeadAttention", (MHAWrong,), {"mistake": mistake})


class MHASeparate(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))


class MHAStacked(ref.MultiHeadAttention):
    def split_qkv(self, x):  # the einops pattern's (3, b, h, n, d), before unbind: it unpacks as q, k, v
        super().split_qkv(x)  # validates x
        return rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)


@pytest.mark.parametrize("impl", [ref.MultiHeadAttention, MHATimmStyle, mha_with(None), MHAStacked])
def test_mha_accepts(impl, capsys):
    accepts(checks.MultiHeadAttention, impl, capsys)


def split_no_check(x, h):
    b, n, width = x.shape
    return x[..., : width // h * h].reshape(b, n, h, -1).transpose(1, 2)  # silently drops features


def split_names_one(x, h):
    if x.shape[-1] % h:
        raise ValueError(f"width {x.shape[-1]} cannot be split evenly")
    return ref.split_heads(x, h)


def split_vague_error(x, h):
    if x.shape[-1] % h:
        raise ValueError("bad width")
    return ref.split_heads(x, h)


def test_merge_heads_message_reads_clearly():
    with pytest.raises(CheckFailed) as info:
        checks.merge_heads(lambda x: x.reshape(x.shape[0], x.shape[2], -1))
    cause = str(info.value).split("likely cause: ")[1]
    assert cause == ("your heads look merged without a transpose: `.reshape(b, n, h * d)` on the (b, h, n, d) "
                     "tensor mixes tokens and heads; first bring the tokens in front of the heads, x.transpose(1, 2) "
                     "gives (b, n, h, d), then flatten the last two axes")
    with pytest.raises(CheckFailed, match="transposed or permuted tensor is not contiguous in memory: use .reshape"):
        checks.merge_heads(lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1))


class MHAFused(nn.Module):
    """The fused kernel, as the exercise asks (a correct variant); ``slip`` names one mistake."""

    slip = None

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        if dim % num_heads and self.slip != "no_init_check":
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(proj_drop)

    def split_qkv(self, x):
        if self.slip != "no_x_check" and (x.ndim != 3 or x.shape[-1] != self.dim):
            raise ValueError(f"expected (b, n, {self.dim}), got {tuple(x.shape)}")
        return rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads).unbind(0)

    def forward(self, x, mask=None):
        q, k, v = self.split_qkv(x)
        if self.slip == "output_dropout":  # attention dropout on the heads' outputs, not on the weights
            out = self.attn_drop(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            return self.proj_drop(self.proj(ref.merge_heads(out)))
        p = {"eval_dropout": self.attn_drop.p, "no_dropout": 0.0}.get(
            self.slip, self.attn_drop.p if self.training else 0.0)
        out = self.proj(ref.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)))
        return F.dropout(out, self.proj_drop.p) if self.slip == "F.dropout" else self.proj_drop(out)

    def attention_weights(self, x, mask=None):
        weights = sdpa(*self.split_qkv(x), mask)[1]
        if self.slip == "weights_dropout":
            weights = self.attn_drop(weights)
        return weights.mean(1) if self.slip == "weights_mean" else weights


def fused(slip):
    if slip == "no_mask_param":  # attention_weights(x) without the statement's mask parameter
        without_mask = {"attention_weights": lambda self, x: sdpa(*self.split_qkv(x))[1]}
        return type("MultiHeadAttention", (MHAFused,), without_mask)
    return type("MultiHeadAttention", (MHAFused,), {"slip": slip})


def test_mha_accepts_the_fused_kernel(capsys):
    accepts(checks.MultiHeadAttention, fused(None), capsys)


def split_detached(x, h):
    return ref.split_heads(x.detach(), h)


def split_in_place(x, h):
    if x.shape[-1] % h:
        raise ValueError(f"width {x.shape[-1]} is not divisible by num_heads={h}")
    return x.unflatten_(-1, (h, -1)).transpose(1, 2) if hasattr(x, "unflatten_") else x.unsqueeze_(0)[0].unflatten(
        -1, (h, -1)).transpose(1, 2)


def merge_in_place(x):
    return x.transpose_(1, 2).flatten(2)


class MHASlip(MHAFused):
    """The fused-kernel MultiHeadAttention of the statement, with one more slip."""

    def __init__(self, dim, num_heads, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop)
        if self.slip == "no_head_dim":
            del self.head_dim
        if self.slip == "qkv_bias_ignored":
            self.qkv = nn.Linear(dim, 3 * dim)

    def split_qkv(self, x):
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError("bad tokens" if self.slip == "vague_error" else f"expected (b, n, {self.dim}), got "
                             f"{tuple(x.shape)}")
        qkv = self.qkv(x).detach() if self.slip == "qkv_detached" else self.qkv(x)
        layout = "h three d" if self.slip == "split_order" else "three h d"
        return rearrange(qkv, f"b n ({layout}) -> three b h n d", three=3, h=self.num_heads).unbind(0)

    def forward(self, x, mask=None):
        if self.slip == "in_place":
            x *= 1.0 + 1e-3
        if self.slip == "no_mask":
            mask = None
        return super().forward(x, mask)


def mha(slip):
    return type("MultiHeadAttention", (MHASlip,), {"slip": slip})


class MHANoSplit(MHAFused):
    split_qkv = None

    def forward(self, x, mask=None):
        return ref.MultiHeadAttention.forward(self, x, mask)

    def attention_weights(self, x, mask=None):
        return ref.MultiHeadAttention.attention_weights(self, x, mask)


MHANoSplit.split_qkv = None


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("split_heads", "output", "view", split_view, "without a transpose"),
    slip("split_heads", "error", "names_one", split_names_one, "which does not name 4"),
    slip("split_heads", "error", "no_check", split_no_check, "expected a ValueError, your code returned tensor"),
    slip("split_heads", "gradient", "detach", split_detached, r"carries no gradient(.|\n)*x.detach\(\)"),
    slip("split_heads", "inputs", "in_place", split_in_place, "changed its input `x` in place"),
    slip("merge_heads", "output", "no_transpose", lambda x: x.reshape(x.shape[0], x.shape[2], -1),
         "without a transpose"),
    slip("merge_heads", "gradient", "detach", lambda x: ref.merge_heads(x).detach(), "carries no gradient"),
    slip("merge_heads", "inputs", "in_place", merge_in_place, "changed its input `x` in place"),
    slip("MultiHeadAttention", "names", "separate", MHASeparate, "one fused Linear `qkv`"),
    slip("MultiHeadAttention", "names", "qkv_bias_ignored", mha("qkv_bias_ignored"),
         r"unexpected \['qkv.bias'\](.|\n)*qkv_bias=False seems ignored"),
    slip("MultiHeadAttention", "attributes", "no_head_dim", mha("no_head_dim"),
         r"head_dim should be 4, got None(.|\n)*self.head_dim = dim // num_heads"),
    slip("MultiHeadAttention", "split_qkv", "order", mha("split_order"), "q, k and v from split_qkv(.|\n)*wrong order"),
    slip("MultiHeadAttention", "split_qkv", "missing", MHANoSplit, "has no method split_qkv"),
    slip("MultiHeadAttention", "output", "no_proj", mha_with("proj"), "`proj` seems to be missing"),
    slip("MultiHeadAttention", "mask", "no_mask", mha("no_mask"), "mask seems to be ignored"),
    slip("MultiHeadAttention", "attention_weights", "mean", fused("weights_mean"), r"one \(n, n\) map per head"),
    slip("MultiHeadAttention", "dropout", "eval_dropout", fused("eval_dropout"), "attention dropout is applied in "
         "eval"),
    slip("MultiHeadAttention", "error-dim", "no_init_check", fused("no_init_check"),
         "dim=10 is not divisible by num_heads=3: expected a ValueError"),
    slip("MultiHeadAttention", "error-shape", "no_x_check", fused("no_x_check"),
         r"tokens of width 13 .*expected a ValueError, your code raised RuntimeError(.|\n)*split_qkv"),
    slip("MultiHeadAttention", "error-shape", "vague", mha("vague_error"),
         r"your ValueError says 'bad tokens', which does not name \(2, 5, 13\)"),
    slip("MultiHeadAttention", "gradient", "qkv_detached", mha("qkv_detached"),
         r"no gradient reaches `qkv.weight`(.|\n)*self.qkv\(x\).detach\(\)"),
    slip("MultiHeadAttention", "inputs", "in_place", mha("in_place"), "changed its input `x` in place"),
]


# folded from the parametrized tests: each rejected under the rule the check blames
SLIPS += [
    slip("split_heads", "output", "split_heads_rejects_1", lambda x, h: rearrange(x, "b n (d h) -> b h n d", h=h),
         "contiguous block"),
    slip("split_heads", "output", "split_heads_rejects_2", lambda x, h: rearrange(x, "b n (h d) -> b n h d", h=h),
         "move the head axis"),
    slip("merge_heads", "output", "merge_heads_rejects_1", lambda x: rearrange(x, "b h n d -> b n (d h)"),
         "interleaved"),
    slip("merge_heads", "output", "merge_heads_rejects_2", lambda x: x.transpose(1, 2), "flatten heads"),
    slip("merge_heads", "output", "merge_heads_rejects_3", lambda x: x.flatten(2),
         "flattens tokens and features together"),
    slip("MultiHeadAttention", "output", "mha_rejects_0", mha_with("view"), "reshaped without a transpose"),
    slip("MultiHeadAttention", "output", "mha_rejects_1", mha_with("merge"), "merged without a transpose"),
    slip("MultiHeadAttention", "output", "mha_rejects_2", mha_with("scale"), r"1/sqrt\(head_dim\)"),
    slip("MultiHeadAttention", "output", "mha_rejects_3", mha_with("order"), "wrong order"),
    slip("split_heads", "error", "split_heads_rejects_more_0", lambda x, h: rearrange(x, "b n (h d) -> b h n d", h=h),
         "a width of 10 is not divisible by 4 heads: expected a ValueError, your code raised EinopsError"),
    slip("split_heads", "error", "split_heads_rejects_more_3", split_vague_error,
         "your ValueError says 'bad width', which does not name 10 and 4"),
    slip("split_heads", "output", "split_heads_rejects_more_4", lambda x, h: rearrange(x, "b n (h d) -> b h n d", d=h),
         "num_heads was used as the width of a head"),
    slip("MultiHeadAttention", "dropout", "mha_rejects_more_1", fused("no_dropout"),
         r"with attn_drop=0.5, in training mode two calls(.|\n)*attn_drop seems ignored"),
    slip("MultiHeadAttention", "dropout", "mha_rejects_more_2", fused("F.dropout"),
         r"with proj_drop=0.5, in eval mode(.|\n)*output dropout is applied in eval mode"),
    slip("MultiHeadAttention", "dropout", "mha_rejects_more_3", fused("weights_dropout"),
         "attention_weights applies the attention dropout"),
    slip("MultiHeadAttention", "dropout", "mha_rejects_more_5", fused("output_dropout"),
         r"missing: attn_drop=0.5 on the attention weights(.|\n)*drops attention weights, not outputs"),
    slip("MultiHeadAttention", "attention_weights", "mha_rejects_more_6", fused("no_mask_param"),
         r"attention_weights takes no mask argument(.|\n)*pass the mask on"),
]
