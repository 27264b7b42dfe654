"""The checks of vit_course/checks/blocks.py (chapter 03: MLP, LayerNorm, DropPath) catch the usual mistakes and
accept correct variants.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects, slip


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


@pytest.mark.parametrize("impl, hint", [
    (drop(elementwise=True), "partly zeroed"),
    (drop(scale=lambda p: 1.0), "not scaled"),
    (drop(scale=lambda p: 1 - p), "multiplied by"),
    (drop(in_eval=True), "eval mode"),
    (drop(keep_is_p=True), "probability to drop"),
    (drop(inplace=True), "changed its input `x` in place"),
])
def test_droppath_rejects(impl, hint):
    rejects(checks.DropPath, impl, hint)


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


@pytest.mark.parametrize("impl, hint", [
    (MLPNoBias, "the Linear layers need their bias"),
    (MLPFunctionalDropout, r"with drop=0.5, in eval mode two calls(.|\n)*dropout is applied in eval mode"),
    (subclass(ref.MLP, lambda self, x: self.fc2(self.act(self.fc1(x)))), r"in training mode(.|\n)*drop seems ignored"),
])
def test_mlp_rejects_more(impl, hint):
    rejects(checks.MLP, impl, hint)


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


@pytest.mark.parametrize("impl, hint", [
    (LayerNormPlainTensors, r"`weight` should be an nn.Parameter, got tensor\(6,\)"),
    (LayerNormRandomStart, "should start with `weight` all 1"),
    (LayerNormTorchDefault, "the default eps is not 1e-6"),
])
def test_layernorm_rejects_more(impl, hint):
    rejects(checks.LayerNorm, impl, hint)


class DropPathOneCoin(DropPathTimm):
    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        return x * (torch.rand(()) >= self.p) / (1 - self.p)  # one coin for the whole batch


class DropPathNoCheck(DropPathTimm):
    def __init__(self, p=0.0):
        nn.Module.__init__(self)
        self.p = p


@pytest.mark.parametrize("impl, hint", [
    (DropPathOneCoin, r"samples were (dropped|kept) together(.|\n)*not one coin for the whole batch"),
    (DropPathNoCheck, "p=1.0 is not a probability below 1: expected a ValueError"),
])
def test_droppath_rejects_more(impl, hint):
    rejects(checks.DropPath, impl, hint)


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
