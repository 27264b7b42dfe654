"""Our ViT against timm's VisionTransformer: same parameter count, same logits after weight conversion."""

import pytest
import torch

from vit_course import CONFIGS, ViT, convert_timm_state_dict, count_parameters, layer_attentions

from .timm_shim import import_timm

timm = import_timm()
pytestmark = pytest.mark.skipif(timm is None, reason="timm not installed (make setup installs it with --no-deps)")


def timm_vit(**kw):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**kw)


def randomise(model):
    """timm starts LayerNorms at 1/0 and some biases at 0: randomise everything so nothing hides."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def test_vit_b16_matches_timm_parameter_count_and_logits():
    """CI's stand-in for chapter 05's comparison with timm's pretrained ViT-B/16 (which needs a download): the same
    conversion on randomised weights, so every parameter has to land in the right place."""
    ref = randomise(timm.create_model("vit_base_patch16_224", pretrained=False)).eval()
    ours = ViT(**CONFIGS["ViT-B/16"]).eval()
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters()) == 86_567_656
    ours.load_state_dict(convert_timm_state_dict(ref.state_dict()))
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("image_size,patch_size,in_chans,init_values", [
    (32, 4, 3, None), ((28, 21), 7, 1, None), (32, 4, 3, 0.1)])  # the last with LayerScale (randomised per channel)
def test_small_config_logits_and_attention_match_timm(image_size, patch_size, in_chans, init_values):
    kw = dict(img_size=image_size, patch_size=patch_size, in_chans=in_chans, num_classes=10, embed_dim=48,
              depth=3, num_heads=4, mlp_ratio=2.0, init_values=init_values)
    ref = randomise(timm_vit(**kw)).eval()
    ours = ViT(image_size=image_size, patch_size=patch_size, in_channels=in_chans, num_classes=10, dim=48,
               depth=3, num_heads=4, mlp_ratio=2.0, init_values=init_values).eval()
    ours.load_state_dict(convert_timm_state_dict(ref.state_dict()))
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    x = torch.randn(3, in_chans, *size)
    weights = []  # timm's own attention weights: its explicit path, caught where they enter attn_drop
    for block in ref.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda module, inputs, output: weights.append(output))
    with torch.no_grad():
        expected = ref(x)
        assert torch.allclose(ours(x), expected, atol=1e-5, rtol=1e-5)
        ours_weights = layer_attentions(ours, x)  # L x (b, h, n, n), block by block
    assert len(ours_weights) == len(weights) == len(ref.blocks)
    for ours_w, timm_w in zip(ours_weights, weights, strict=True):
        assert torch.allclose(ours_w, timm_w, atol=1e-6), (ours_w - timm_w).abs().max()


@pytest.mark.parametrize("name, timm_name", [
    ("ViT-Ti/16", "vit_tiny_patch16_224"), ("ViT-S/16", "vit_small_patch16_224"), ("ViT-B/16", "vit_base_patch16_224"),
    ("ViT-L/16", "vit_large_patch16_224"), ("ViT-H/14", "vit_huge_patch14_224")])
def test_every_config_has_timms_parameter_count(name, timm_name):
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        ref = timm.create_model(timm_name, pretrained=False, num_classes=1000)  # timm's ViT-H defaults to no head
        ours = ViT(**CONFIGS[name])
    count = sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in ours.parameters()) == count_parameters(**CONFIGS[name]) == count


def test_unsupported_timm_weights_are_refused():
    ref = timm_vit(img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=1, num_heads=2, global_pool="avg")
    with pytest.raises(ValueError, match="fc_norm"):
        convert_timm_state_dict(ref.state_dict())


@pytest.mark.parametrize("old_grid, new_grid, prefix, dtype", [
    ((4, 4), (8, 8), 1, torch.float32),  # chapter 09's 16 px -> 32 px
    ((14, 14), (24, 24), 1, torch.float32),  # the ViT paper's 224 -> 384 px at patch 16
    ((8, 8), (5, 5), 1, torch.float32),  # down, where antialiasing matters
    ((3, 4), (6, 2), 2, torch.float32),  # non-square, two prefix tokens (class and distillation, as in DeiT)
    ((4, 4), (7, 7), 0, torch.bfloat16),  # no prefix (mean pooling), the table's own dtype kept
])
def test_resample_position_embeddings_matches_timm(old_grid, new_grid, prefix, dtype):
    """Chapter 09's exercise against timm's resample_abs_pos_embed (bicubic, antialias, the default ViT path)."""
    from timm.layers import resample_abs_pos_embed

    from vit_course import resample_position_embeddings

    torch.manual_seed(0)
    table = torch.randn(1, prefix + old_grid[0] * old_grid[1], 16).to(dtype)
    ours = resample_position_embeddings(table, new_grid, num_prefix_tokens=prefix, old_grid=old_grid)
    theirs = resample_abs_pos_embed(table, list(new_grid), list(old_grid), num_prefix_tokens=prefix)
    assert ours.dtype == theirs.dtype == dtype
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_minimal_vit_runs_timms_vit_b16_weights():
    """Chapter 05's online cell, offline: timm's ViT-B/16 (randomised, no download) converted into MinimalViT."""
    from vit_course import MinimalViT

    ref = randomise(timm.create_model("vit_base_patch16_224", pretrained=False)).eval()
    ours = MinimalViT(**CONFIGS["ViT-B/16"]).eval()
    ours.load_state_dict(convert_timm_state_dict(ref.state_dict()))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-4, rtol=1e-4)
