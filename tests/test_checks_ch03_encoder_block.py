"""Chapter 03's checks (MLP, LayerNorm, DropPath, EncoderBlock) catch the usual mistakes and accept correct
variants."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vit_course as ref
from vit_course import MLP, MultiHeadAttention, checks

from .check_helpers import accepts, slip


def subclass(base, forward, name=None, **attrs):
    return type(name or base.__name__, (base,), dict(forward=forward, **attrs))


class MLPErf(nn.Module):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)
        self.drop = drop

    def forward(self, x):
        h = self.fc1(x)
        h = F.dropout(0.5 * h * (1 + torch.erf(h / math.sqrt(2))), self.drop, self.training)  # exact GELU
        return F.dropout(self.fc2(h), self.drop, self.training)


class MLPNames(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)


@pytest.mark.parametrize("impl", [ref.MLP, MLPErf])
def test_mlp_accepts(impl, capsys):
    accepts(checks.MLP, impl, capsys)


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


@pytest.mark.parametrize("impl", [ref.LayerNorm, LayerNormRsqrt, LayerNormF])
def test_layernorm_accepts(impl, capsys):
    accepts(checks.LayerNorm, impl, capsys)


class DropPathTimm(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"p={p} is not in [0, 1)")
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


@pytest.mark.parametrize("impl", [ref.DropPath, DropPathTimm, drop()])
def test_droppath_accepts(impl, capsys):
    accepts(checks.DropPath, impl, capsys)


class MLPNoBias(ref.MLP):
    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__(dim, hidden_dim, drop)
        self.fc1, self.fc2 = nn.Linear(dim, hidden_dim, bias=False), nn.Linear(hidden_dim, dim, bias=False)


class MLPFunctionalDropout(ref.MLP):
    def forward(self, x):
        return F.dropout(self.fc2(F.dropout(self.act(self.fc1(x)), self.drop1.p)), self.drop2.p)  # training=True


class LayerNormPlainTensors(ref.LayerNorm):
    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)
        del self.weight, self.bias
        self.weight, self.bias = torch.ones(dim), torch.zeros(dim)


class LayerNormRandomStart(ref.LayerNorm):
    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)
        self.weight = nn.Parameter(torch.randn(dim))


class LayerNormTorchDefault(ref.LayerNorm):
    def __init__(self, dim, eps=1e-5):
        super().__init__(dim, eps)


class DropPathOneCoin(DropPathTimm):
    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        return x * (torch.rand(()) >= self.p) / (1 - self.p)  # one coin for the whole batch


class DropPathNoCheck(DropPathTimm):
    def __init__(self, p=0.0):
        nn.Module.__init__(self)
        self.p = p


class MLPSlip(ref.MLP):
    slip = None

    def forward(self, x):
        if self.slip == "in_place":
            x.clamp_(-3, 3)
        hidden = self.fc1(x).detach() if self.slip == "detach" else self.fc1(x)
        if self.slip == "no_grad":
            with torch.no_grad():
                return self.drop2(self.fc2(self.drop1(self.act(hidden))))
        if self.slip == "residual_inside":
            return x + self.drop2(self.fc2(self.drop1(self.act(hidden))))
        if self.slip == "no_drop2":
            return self.fc2(self.drop1(self.act(hidden)))
        if self.slip == "drop_before_act":
            return self.drop2(self.fc2(self.act(self.drop1(hidden))))
        if self.slip == "one_dropout":
            return self.drop(self.fc2(self.drop(self.act(hidden))))
        return self.drop2(self.fc2(self.drop1(self.act(hidden))))


def mlp(slip):
    return type("MLP", (MLPSlip,), {"slip": slip})


class MLPOneDropout(MLPSlip):
    """One dropout module `drop` for both places (the statement names two, drop1 and drop2)."""

    slip = "one_dropout"

    def __init__(self, dim, hidden_dim, drop=0.0):
        super().__init__(dim, hidden_dim, drop)
        del self.drop1, self.drop2
        self.drop = nn.Dropout(drop)


class DropPathOtherName(DropPathTimm):
    """p kept as `drop_prob`: the given extra_repr, which reads self.p, then raises."""

    def __init__(self, p=0.0):
        super().__init__(p)
        self.drop_prob = p
        del self.p

    def forward(self, x):
        self.p = self.drop_prob
        try:
            return super().forward(x)
        finally:
            del self.p

    def extra_repr(self):
        return f"p={self.p}"


class LayerNormSlip(ref.LayerNorm):
    slip = None

    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)
        if self.slip == "eps_parameter":
            self.eps = nn.Parameter(torch.tensor(eps))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        mean = mean.detach() if self.slip == "mean_detached" else mean
        var = x.var(-1, unbiased=False, keepdim=True)
        weight = self.weight.data if self.slip == "weight_data" else self.weight
        if self.slip == "in_place":
            x -= mean
            return x / torch.sqrt(var + self.eps) * weight + self.bias
        return (x - mean) / torch.sqrt(var + self.eps) * weight + self.bias


def layer_norm(slip):
    return type("LayerNorm", (LayerNormSlip,), {"slip": slip})


class DropPathSlip(DropPathTimm):
    slip = None

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        shape = (x.shape[0], 1, 1) if self.slip == "mask_3d" else (x.shape[0],) + (1,) * (x.ndim - 1)
        mask = (torch.rand(shape) < keep).to(x.dtype) / keep
        return (x.detach() if self.slip == "detach" else x) * mask


def drop_path(slip):
    return type("DropPath", (DropPathSlip,), {"slip": slip})


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("MLP", "names", "names", MLPNames, "fc1"),
    slip("MLP", "names", "no_bias", MLPNoBias, "the Linear layers need their bias"),
    slip("MLP", "output", "relu", subclass(ref.MLP, lambda self, x: self.fc2(F.relu(self.fc1(x)))), "ReLU"),
    slip("MLP", "output", "tanh", subclass(ref.MLP, lambda self, x: self.fc2(F.gelu(self.fc1(x), approximate="tanh"))),
         "tanh approximation"),
    slip("MLP", "dropout", "functional", MLPFunctionalDropout, "dropout is applied in eval mode"),
    slip("MLP", "output", "residual_inside", mlp("residual_inside"), "the residual belongs to the encoder block"),
    slip("MLP", "dropout", "no_drop2", mlp("no_drop2"), r"missing: the dropout after fc2 \(drop2\)"),
    slip("MLP", "dropout", "drop_before_act", mlp("drop_before_act"),
         r"right probabilities but sit in other places(.|\n)*fc1, GELU, dropout, fc2, dropout"),
    slip("MLP", "dropout", "one_dropout", MLPOneDropout, r"dropout modules are \['drop'\], the statement's are drop1"),
    slip("MLP", "gradient", "detach", mlp("detach"), r"no gradient reaches `fc1.weight`(.|\n)*self.fc1\(x\).detach"),
    slip("MLP", "gradient", "no_grad", mlp("no_grad"), r"carries no gradient at all(.|\n)*torch.no_grad"),
    slip("MLP", "inputs", "clamp_", mlp("in_place"), "changed its input `x` in place"),
    slip("LayerNorm", "names", "eps_parameter", layer_norm("eps_parameter"), r"unexpected \['eps'\]"),
    slip("LayerNorm", "parameters", "plain_tensors", LayerNormPlainTensors, "should be an nn.Parameter"),
    slip("LayerNorm", "parameters", "random_start", LayerNormRandomStart, "should start with `weight` all 1"),
    slip("LayerNorm", "output", "unbiased", subclass(ref.LayerNorm, ln_forward(unbiased=True)), "unbiased variance"),
    slip("LayerNorm", "output", "eps_outside", subclass(ref.LayerNorm, ln_forward(eps_outside=True)),
         "inside the square root"),
    slip("LayerNorm", "eps", "torch_default", LayerNormTorchDefault, "the default eps is not 1e-6"),
    slip("LayerNorm", "gradient", "mean_detached", layer_norm("mean_detached"),
         r"the gradient reaching `x` differs from the reference's(.|\n)*mean = mean.detach\(\)"),
    slip("LayerNorm", "gradient", "weight_data", layer_norm("weight_data"),
         r"no gradient reaches `weight`(.|\n)*self.weight.data"),
    slip("LayerNorm", "inputs", "x_minus_mean", layer_norm("in_place"), "changed its input `x` in place"),
    slip("DropPath", "eval", "in_eval", drop(in_eval=True), "eval mode"),
    slip("DropPath", "training", "elementwise", drop(elementwise=True), "partly zeroed"),
    slip("DropPath", "training", "one_coin", DropPathOneCoin, "not one coin for the whole batch"),
    slip("DropPath", "training", "not_scaled", drop(scale=lambda p: 1.0), "not scaled"),
    slip("DropPath", "training", "mask_3d", drop_path("mask_3d"),
         r"shape \(3000, 3000, 7\), expected \(3000, 7\)(.|\n)*give it x.ndim axes"),
    slip("DropPath", "error", "no_check", DropPathNoCheck, "p=1.0 is not a probability below 1: expected a ValueError"),
    slip("DropPath", "gradient", "detach", drop_path("detach"), r"carries no gradient at all(.|\n)*x.detach\(\)"),
    slip("DropPath", "inputs", "mul_", drop(inplace=True), "changed its input `x` in place"),
    slip("DropPath", "p", "drop_prob", DropPathOtherName,
         r"print\(DropPath\(0.25\)\) raised AttributeError(.|\n)*keep the probability as self.p"),
]


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
SLIPS += [
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


# folded from the parametrized tests: each rejected under the rule the check blames
SLIPS += [
    slip("MLP", "output", "mlp_rejects_2", subclass(ref.MLP, lambda self, x: self.fc2(self.fc1(x))), "no activation"),
    slip("LayerNorm", "output", "layernorm_rejects_2", subclass(ref.LayerNorm, ln_forward(affine=False)),
         "weight and bias are not applied"),
    slip("LayerNorm", "output", "layernorm_rejects_3", subclass(ref.LayerNorm, ln_forward(eps=1e-5)),
         "eps seems ignored"),
    slip("LayerNorm", "output", "layernorm_rejects_4", subclass(ref.LayerNorm, ln_forward(axis=0)), "wrong axis"),
    slip("LayerNorm", "parameters", "layernorm_rejects_5", LayerNormNoParams, "`weight`"),
    slip("DropPath", "training", "droppath_rejects_2", drop(scale=lambda p: 1 - p), "multiplied by"),
    slip("DropPath", "training", "droppath_rejects_4", drop(keep_is_p=True), "probability to drop"),
    slip("MLP", "dropout", "mlp_rejects_more_2", subclass(ref.MLP, lambda self, x: self.fc2(self.act(self.fc1(x)))),
         r"in training mode(.|\n)*drop seems ignored"),
    slip("EncoderBlock", "output", "block_rejects_1", block("shared"), "same LayerNorm is used twice"),
    slip("EncoderBlock", "options", "block_rejects_more_1", block_slip("init_values"), "ls1 and ls2 are LayerScale"),
    slip("EncoderBlock", "options", "block_rejects_more_2", block_slip("no_ls"), "LayerScale is not applied"),
    slip("EncoderBlock", "options", "block_rejects_more_6", block_slip("eval_drop_path"),
         "in eval mode two calls on the same input gave different outputs"),
]
