"""Attention and multi-head attention against PyTorch's own implementations."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vit_course import (
    MultiHeadAttention,
    SelfAttention,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
    split_is_correct,
)

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6)), ((5, 4), (9, 4), (9, 11))])
def test_sdpa_matches_torch(shape):
    torch.manual_seed(0)
    q, k, v = (torch.randn(s) for s in shape)
    out, weights = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), **TOL)
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), **TOL)


def test_sdpa_with_masks_matches_torch():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    for mask in (torch.rand(5, 7) > 0.4, torch.rand(2, 1, 5, 7) > 0.4, torch.ones(5, 7, dtype=torch.bool).tril()):
        mask[..., 0] = True  # no fully masked row
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_sdpa_query_that_may_attend_nowhere_gets_zeros_as_in_torch():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[2] = False  # query 2 may attend to no key
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    assert (weights[:, 2] == 0).all() and torch.allclose(weights[:, [0, 1, 3]].sum(-1), torch.ones(2, 3), **TOL)
    out.sum().backward()
    assert all(t.grad.isfinite().all() for t in (q, k, v))
    mha = MultiHeadAttention(6, 2).eval()
    weights = mha.attention_weights(q.detach(), mask)  # the explicit path agrees with the fused forward's zeros
    assert (weights[:, :, 2] == 0).all() and weights.isfinite().all()


def test_sdpa_bad_input():
    with pytest.raises(ValueError, match="8.*6|same last dimension"):
        scaled_dot_product_attention(torch.randn(3, 8), torch.randn(4, 6), torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"same number of tokens, got k \(4, 8\) and v \(5, 2\)"):
        scaled_dot_product_attention(torch.randn(3, 8), torch.randn(4, 8), torch.randn(5, 2))
    with pytest.raises(ValueError, match="boolean"):
        scaled_dot_product_attention(torch.randn(3, 8), torch.randn(4, 8), torch.randn(4, 2), torch.ones(3, 4))


def test_self_attention_is_one_head():
    torch.manual_seed(2)
    attn = SelfAttention(dim=10, head_dim=6)
    x = torch.randn(3, 7, 10)
    out, weights = attn(x), attn.attention_weights(x)
    assert out.shape == (3, 7, 6) and weights.shape == (3, 7, 7)
    expected = F.scaled_dot_product_attention(x @ attn.q.weight.T, x @ attn.k.weight.T, x @ attn.v.weight.T)
    assert torch.allclose(out, expected, **TOL)


def test_split_merge_heads():
    x = torch.arange(2 * 3 * 12.0).reshape(2, 3, 12)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 3)
    assert torch.equal(heads[:, 1], x[..., 3:6])  # head 1 owns features 3..5 of every token
    assert torch.equal(merge_heads(heads), x)
    with pytest.raises(ValueError, match="12.*5"):
        split_heads(x, 5)


def test_split_is_correct_tells_the_split_from_the_view_bug():
    def view_bug(x, num_heads):
        b, n, _ = x.shape
        return x.view(b, num_heads, n, -1)  # the right shape, tokens and heads mixed

    def transposed_view(x, num_heads):
        b, n, width = x.shape
        return x.view(b, n, num_heads, width // num_heads).transpose(1, 2)

    assert split_is_correct(split_heads) is True and split_is_correct(transposed_view) is True
    assert split_is_correct(view_bug) is False
    assert split_is_correct(lambda x, h: split_heads(x, h).transpose(1, 2)) is False  # (b, n, h, d): a False, no error


def copy_from_torch_mha(torch_mha, dim, num_heads):
    mha = MultiHeadAttention(dim, num_heads)
    with torch.no_grad():
        mha.qkv.weight.copy_(torch_mha.in_proj_weight)
        mha.qkv.bias.copy_(torch_mha.in_proj_bias)
        mha.proj.weight.copy_(torch_mha.out_proj.weight)
        mha.proj.bias.copy_(torch_mha.out_proj.bias)
    return mha


def test_mha_matches_nn_multihead_attention():
    torch.manual_seed(3)
    dim, heads = 24, 4
    ref = nn.MultiheadAttention(dim, heads, batch_first=True).eval()
    mha = copy_from_torch_mha(ref, dim, heads).eval()
    x = torch.randn(3, 9, dim)
    expected, expected_weights = ref(x, x, x, average_attn_weights=False)
    assert torch.allclose(mha(x), expected, **TOL)
    out, weights = mha(x), mha.attention_weights(x)
    assert torch.allclose(out, expected, **TOL)
    # the explicit weights times the values give the fused kernel's output
    explicit = mha.proj(merge_heads(weights @ mha.split_qkv(x)[2]))
    assert torch.allclose(explicit, expected, **TOL)
    assert torch.allclose(weights, expected_weights, **TOL)
    mask = torch.rand(9, 9) > 0.3
    mask.fill_diagonal_(True)
    # nn.MultiheadAttention's boolean mask means the opposite: True = may NOT attend.
    expected_masked, _ = ref(x, x, x, attn_mask=~mask)
    assert torch.allclose(mha(x, mask=mask), expected_masked, **TOL)
    masked_weights = mha.attention_weights(x, mask=mask)
    assert torch.allclose(mha.proj(merge_heads(masked_weights @ mha.split_qkv(x)[2])), expected_masked, **TOL)


def test_mha_parameter_count_does_not_depend_on_heads():
    counts = {h: sum(p.numel() for p in MultiHeadAttention(48, h).parameters()) for h in (1, 2, 3, 4, 6, 8)}
    assert set(counts.values()) == {4 * 48 * 48 + 4 * 48}


def test_mha_is_permutation_equivariant():
    torch.manual_seed(4)
    mha = MultiHeadAttention(16, 2).eval()
    x, perm = torch.randn(2, 11, 16), torch.randperm(11)
    assert torch.allclose(mha(x)[:, perm], mha(x[:, perm]), **TOL)


def test_mha_bad_input():
    with pytest.raises(ValueError, match="dim=10.*num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="16.*\\(2, 5, 12\\)"):
        MultiHeadAttention(16, 2)(torch.randn(2, 5, 12))
