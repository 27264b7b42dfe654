"""Our ViT against timm's VisionTransformer: same parameter count, same logits after weight conversion."""

import pytest
import torch

from vit_course import CONFIGS, ViT, convert_timm_state_dict, layer_attentions

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
    ref = randomise(timm.create_model("vit_base_patch16_224", pretrained=False)).eval()
    ours = ViT(**CONFIGS["ViT-B/16"]).eval()
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters()) == 86_567_656
    ours.load_state_dict(convert_timm_state_dict(ref.state_dict()))
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("image_size,patch_size,in_chans", [(32, 4, 3), ((28, 21), 7, 1)])
def test_small_config_logits_and_attention_match_timm(image_size, patch_size, in_chans):
    kw = dict(img_size=image_size, patch_size=patch_size, in_chans=in_chans, num_classes=10, embed_dim=48,
              depth=3, num_heads=4, mlp_ratio=2.0)
    ref = randomise(timm_vit(**kw)).eval()
    ours = ViT(image_size=image_size, patch_size=patch_size, in_channels=in_chans, num_classes=10, dim=48,
               depth=3, num_heads=4, mlp_ratio=2.0).eval()
    ours.load_state_dict(convert_timm_state_dict(ref.state_dict()))
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    x = torch.randn(3, in_chans, *size)
    with torch.no_grad():
        expected = ref(x)
        assert torch.allclose(ours(x), expected, atol=1e-5, rtol=1e-5)
        assert len(layer_attentions(ours, x)) == len(ref.blocks)  # the weights come block by block


def test_unsupported_timm_weights_are_refused():
    ref = timm_vit(img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=1, num_heads=2, global_pool="avg")
    with pytest.raises(ValueError, match="fc_norm"):
        convert_timm_state_dict(ref.state_dict())
