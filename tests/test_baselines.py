"""The CNN baselines the ViTs are measured against (vit_course.baselines)."""

import pytest
import torch

from vit_course.baselines import BasicBlock, small_cnn, small_resnet


def test_small_cnn_maps_images_to_logits_and_refuses_too_many_stages():
    assert small_cnn()(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="6 pooling stages"):
        small_cnn(channels=(8,) * 6)


def test_small_resnet_halves_the_map_per_later_stage_and_counts_as_documented():
    model = small_resnet()
    x = torch.randn(2, 3, 32, 32)
    sides = []
    hook = lambda module, inputs, output: sides.append(output.shape[-1])  # noqa: E731
    for block in model:
        if isinstance(block, BasicBlock):
            block.register_forward_hook(hook)
    assert model(x).shape == (2, 10)
    assert sides == [32, 32, 16, 16, 8, 8]  # two blocks per stage; the first of stages 2 and 3 strides
    assert 0.15e6 < sum(p.numel() for p in model.parameters()) < 0.2e6  # "about 0.17 M"


def test_a_basic_block_adds_its_shortcut():
    torch.manual_seed(0)
    block = BasicBlock(4, 4).eval()
    for bn in (block.bn1, block.bn2):
        torch.nn.init.zeros_(bn.weight)  # the residual branch outputs zero: the block is relu(x)
    x = torch.randn(1, 4, 8, 8)
    assert torch.equal(block(x), torch.relu(x))
    with pytest.raises(ValueError, match="at least one stage"):
        small_resnet(channels=())
