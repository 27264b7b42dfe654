"""The encoder block against nn.TransformerEncoderLayer, and its parts."""

import pytest
import torch
from torch import nn

from vit_course import MLP, DropPath, EncoderBlock, LayerNorm

TOL = dict(atol=1e-5, rtol=1e-5)


def randomise_norms(module):
    """LayerNorm starts at weight 1, bias 0: randomise so a swapped or shared norm can't hide."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)


def block_from_torch_layer(layer, dim, heads, mlp_ratio):
    block = EncoderBlock(dim, heads, mlp_ratio)
    a = layer.self_attn
    sd = {
        "norm1.weight": layer.norm1.weight, "norm1.bias": layer.norm1.bias,
        "attn.qkv.weight": a.in_proj_weight, "attn.qkv.bias": a.in_proj_bias,
        "attn.proj.weight": a.out_proj.weight, "attn.proj.bias": a.out_proj.bias,
        "norm2.weight": layer.norm2.weight, "norm2.bias": layer.norm2.bias,
        "mlp.fc1.weight": layer.linear1.weight, "mlp.fc1.bias": layer.linear1.bias,
        "mlp.fc2.weight": layer.linear2.weight, "mlp.fc2.bias": layer.linear2.bias,
    }
    block.load_state_dict({k: v.detach().clone() for k, v in sd.items()})
    return block


def test_block_matches_transformer_encoder_layer():
    torch.manual_seed(0)
    dim, heads, ratio = 32, 4, 2.0
    layer = nn.TransformerEncoderLayer(dim, heads, int(dim * ratio), dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True, layer_norm_eps=1e-6).eval()
    randomise_norms(layer)
    block = block_from_torch_layer(layer, dim, heads, ratio).eval()
    x = torch.randn(3, 10, dim)
    expected = layer(x)
    assert torch.allclose(block(x), expected, **TOL)
    out, weights = block(x), block.attn.attention_weights(block.norm1(x))
    assert torch.allclose(out, expected, **TOL) and weights.shape == (3, heads, 10, 10)
    mask = torch.rand(10, 10) > 0.3
    mask.fill_diagonal_(True)
    assert torch.allclose(block(x, mask=mask), layer(x, src_mask=~mask), **TOL)


def test_mlp_shapes_and_gelu():
    mlp = MLP(8, 20)
    assert mlp(torch.randn(2, 3, 8)).shape == (2, 3, 8)
    assert mlp.act.approximate == "none"


def test_layernorm_from_scratch_matches_torch():
    torch.manual_seed(1)
    ours, ref = LayerNorm(12), nn.LayerNorm(12, eps=1e-6)
    randomise_norms(ref)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 5, 12) * 3 + 1
    assert torch.allclose(ours(x), ref(x), **TOL)


def test_drop_path():
    torch.manual_seed(2)
    dp = DropPath(0.25)
    x = torch.ones(4000, 3, 2)
    y = dp(x)
    per_sample = y[:, 0, 0]
    kept = torch.isclose(per_sample, torch.tensor(1 / 0.75))
    assert ((per_sample == 0) | kept).all()  # a whole sample dropped or kept
    assert (y == y[:, :1, :1]).all()
    assert abs(per_sample.mean().item() - 1.0) < 0.05  # unbiased in expectation
    assert torch.equal(dp.eval()(x), x)
    with pytest.raises(ValueError, match="1.5"):
        DropPath(1.5)


def test_block_options_off_by_default():
    block = EncoderBlock(16, 2)
    assert isinstance(block.drop_path1, nn.Identity) and isinstance(block.ls1, nn.Identity)
    block = EncoderBlock(16, 2, drop_path=0.1, init_values=1e-5)
    assert isinstance(block.drop_path1, DropPath) and block.ls1.gamma.shape == (16,)
