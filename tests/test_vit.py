"""The whole ViT: parameter counts, attention outputs, gradients, errors, hybrid stem."""

import inspect

import pytest
import torch
import torch.nn.functional as F

from vit_course import CONFIGS, ViT, count_parameters, layer_attentions, patchify, pool_tokens, unpatchify
from vit_course.checkpoint import load_checkpoint, save_checkpoint

SMALL = dict(image_size=(16, 12), patch_size=4, in_channels=3, num_classes=7, dim=24, depth=2, num_heads=3)


def n_params(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_vit_b16_has_the_papers_parameter_count():
    config = CONFIGS["ViT-B/16"]
    assert count_parameters(**config) == 86_567_656  # timm's vit_base_patch16_224
    with torch.device("meta"):  # no memory, no init time: only shapes
        model = ViT(**config)
    assert n_params(model) == 86_567_656


@pytest.mark.parametrize("name, layers, width, mlp, heads, millions", [  # the ViT paper's Table 1
    ("ViT-B/16", 12, 768, 3072, 12, 86), ("ViT-L/16", 24, 1024, 4096, 16, 307), ("ViT-H/14", 32, 1280, 5120, 16, 632),
])
def test_configs_are_the_papers_table_1(name, layers, width, mlp, heads, millions):
    """Shapes exactly; the count within 1 %: Table 1 rounds to millions and does not say which head or resolution
    ViT-L's 307 M counts (ours, like timm's vit_large_patch16_224, is 304.3 M; test_timm has the exact counts)."""
    config = CONFIGS[name]
    assert (config["depth"], config["dim"], config["num_heads"]) == (layers, width, heads)
    mlp_ratio = config.get("mlp_ratio", inspect.signature(ViT).parameters["mlp_ratio"].default)
    assert round(mlp_ratio * width) == mlp
    assert abs(count_parameters(**config) / 1e6 - millions) < 0.01 * millions


@pytest.mark.parametrize("extra", [
    {}, dict(pool="mean"), dict(pos_embed="sincos"), dict(pool="mean", class_token=True), dict(mlp_ratio=2.5),
    dict(init_values=1e-4), dict(qkv_bias=False), dict(stem_channels=(8, 16), patch_size=1),
])
def test_count_parameters_matches_module(extra):
    config = {**SMALL, **extra}
    assert count_parameters(**config) == n_params(ViT(**config))


SIDES = dict(in_channels=1, num_classes=10, dim=16, depth=1, num_heads=2, mlp_ratio=2.0)


@pytest.mark.parametrize("side", [28, 30, 32])
@pytest.mark.parametrize("extra", [
    dict(patch_size=2),  # plain: class token, learned positions
    dict(patch_size=2, pos_embed="sincos", pool="mean"),
    dict(patch_size=2, init_values=1e-4),  # LayerScale
    dict(patch_size=1, stem_channels=(4, 8, 8)),  # hybrid, learned positions: 28 -> 14 -> 7 -> 4, 30 -> 15 -> 8 -> 4
    dict(patch_size=1, stem_channels=(4, 8)),  # 30 -> 15 -> 8
    dict(patch_size=1, stem_channels=(4, 8, 8), pos_embed="sincos", pool="mean"),
])
def test_count_parameters_plans_the_grid_as_the_model_does(side, extra):
    """On sides a stem does not halve evenly, the formula must round each stage up, as the stem's pooling does."""
    config = dict(SIDES, image_size=side, **extra)
    assert count_parameters(**config) == n_params(ViT(**config))


def test_forward_shapes_and_attention():
    torch.manual_seed(0)
    model = ViT(**SMALL).eval()
    x = torch.randn(2, 3, 16, 12)
    logits = model(x)
    assert logits.shape == (2, 7)
    attentions = layer_attentions(model, x)  # the weights, block by block; the logits stay the same
    assert torch.allclose(logits, model(x), atol=1e-5)
    assert len(attentions) == 2 and attentions[0].shape == (2, 3, 13, 13)
    assert torch.allclose(attentions[1].sum(-1), torch.ones(2, 3, 13), atol=1e-5)


def test_named_parameters_follow_timm():
    names = dict(ViT(**SMALL).named_parameters())
    for name in ["patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.0.norm1.weight",
                 "blocks.1.attn.qkv.weight", "blocks.1.attn.proj.bias", "blocks.0.mlp.fc1.weight",
                 "blocks.0.mlp.fc2.bias", "norm.weight", "head.weight"]:
        assert name in names, name
    assert names["cls_token"].shape == (1, 1, 24) and names["pos_embed"].shape == (1, 13, 24)


def test_gradients_reach_every_parameter():
    torch.manual_seed(1)
    for extra in ({}, dict(pool="mean", pos_embed="sincos"), dict(stem_channels=(8,), patch_size=2)):
        model = ViT(**{**SMALL, **extra})
        model(torch.randn(3, 3, 16, 12)).square().mean().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
        assert not missing, missing


def test_without_positions_patch_tokens_are_permutation_equivariant():
    """Shuffle the patches of the image itself: with the position table zeroed, the model's patch tokens come out
    shuffled alike (nothing else tells it where a patch sat); with a table, they do not."""
    torch.manual_seed(2)
    model = ViT(**{**SMALL, "pool": "mean"}).eval()  # no class token: every token is a patch
    x = torch.randn(2, 3, 16, 12)
    perm = torch.randperm(12)  # (16 / 4) x (12 / 4) patches
    shuffled = unpatchify(patchify(x, 4)[:, perm], 4, (16, 12))  # the same patches, elsewhere in the image

    def tokens(images):
        t = model.embed(images)  # (b, 12, D), positions added
        for block in model.blocks:
            t = block(t)
        return t

    with torch.no_grad():
        assert not torch.allclose(tokens(x)[:, perm], tokens(shuffled), atol=1e-3)  # the table tells them apart
        model.pos_embed.zero_()
        assert torch.allclose(tokens(x)[:, perm], tokens(shuffled), atol=1e-5)


def test_weights_start_as_timms_do():
    """timm's initialisation (chapter 05): every Linear's weights N(0, 0.02) (truncated far out), its bias zero;
    LayerNorms at scale 1, shift 0."""
    torch.manual_seed(0)
    model = ViT(**{**SMALL, "dim": 192, "num_heads": 3})
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 + 4 * SMALL["depth"] + 1  # patch projection, qkv, proj, fc1, fc2 per block, head
    for m in linears:
        assert abs(m.weight.std().item() - 0.02) < 0.002 and m.weight.abs().max() < 0.2, m
        assert m.bias is None or not m.bias.any(), m
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * SMALL["depth"] + 1
    assert all(bool((m.weight == 1).all() and not m.bias.any()) for m in norms)


def test_bad_input_names_the_numbers():
    with pytest.raises(ValueError, match="30x32.*16x16"):
        ViT(**{**SMALL, "image_size": (30, 32), "patch_size": 16})
    with pytest.raises(ValueError, match="dim=24.*num_heads=5"):
        ViT(**{**SMALL, "num_heads": 5})
    with pytest.raises(ValueError, match="dim=24 is not divisible by num_heads=0 \\(heads: 1 or more\\)"):
        ViT(**{**SMALL, "num_heads": 0})  # was a ZeroDivisionError
    model = ViT(**SMALL)
    with pytest.raises(ValueError, match="3, 16, 12.*\\(2, 1, 16, 12\\)"):
        model(torch.zeros(2, 1, 16, 12))
    with pytest.raises(ValueError, match="\\(2, 3, 16, 16\\)"):
        model(torch.zeros(2, 3, 16, 16))
    with pytest.raises(TypeError, match="float images, normalised.*torch.uint8"):  # data.load's raw pixels
        model(torch.zeros(2, 3, 16, 12, dtype=torch.uint8))
    with pytest.raises(ValueError, match="pool"):
        ViT(**{**SMALL, "pool": "max"})
    with pytest.raises(ValueError, match='pool="cls" needs a class token'):
        ViT(**{**SMALL, "pool": "cls", "class_token": False})


def test_sincos_position_embedding_is_fixed():
    model = ViT(**{**SMALL, "pos_embed": "sincos", "pool": "mean"})
    assert "pos_embed" not in dict(model.named_parameters())
    assert model.pos_embed.shape == (1, 12, 24)


def test_hybrid_stem_makes_tokens_from_a_feature_map():
    model = ViT(image_size=32, patch_size=1, in_channels=3, num_classes=10, dim=32, depth=1, num_heads=2,
                stem_channels=(16, 32))
    assert model.grid_size == (8, 8)  # 32 / 2 / 2
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("on_mps", [False, True])
def test_hybrid_stem_feeds_batch_norm_channels_last_except_on_mps(monkeypatch, on_mps):
    """Channels-last pays on CPUs; on MPS, BatchNorm2d's gradients for channels-last input were wrong (PyTorch issue
    #175189), so there the stem keeps every tensor contiguous. The CPU stands in for MPS by taking its layout."""
    from vit_course import hybrid

    assert hybrid.memory_layout(torch.device("mps")) == torch.contiguous_format
    assert hybrid.memory_layout(torch.device("cpu")) == torch.channels_last
    if on_mps:
        monkeypatch.setattr(hybrid, "memory_layout", lambda device: torch.contiguous_format)
    stem = hybrid.ConvStem(3, (8, 16))  # its weights are channels-last, as built
    seen = []
    for layer in stem.layers:
        if isinstance(layer, torch.nn.BatchNorm2d):
            layer.register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
    stem(torch.randn(2, 3, 16, 16)).sum().backward()
    assert seen == [on_mps, on_mps], f"BatchNorm2d inputs contiguous: {seen}"


@pytest.mark.parametrize("stem_pool", [True, False])
@pytest.mark.parametrize("side", [28, 27, 30])
def test_hybrid_stem_grid_is_the_stems_output_for_any_side(side, stem_pool):
    """Three stages take 28 -> 14 -> 7 -> 4 (each halving rounds up): the grid the model plans is the map it gets."""
    model = ViT(image_size=side, patch_size=1, in_channels=1, num_classes=10, dim=32, depth=1, num_heads=2,
                stem_channels=(4, 8, 16), stem_pool=stem_pool).eval()
    expected = -(-side // 8)
    assert model.grid_size == (expected, expected)
    assert model.stem(torch.randn(2, 1, side, side)).shape == (2, 16, expected, expected)
    assert model(torch.randn(2, 1, side, side)).shape == (2, 10)


@pytest.mark.parametrize("stem_pool", [True, False])
def test_stem_matches_conv_batchnorm_relu_by_hand(stem_pool):
    """Each stage is conv3x3 -> BatchNorm -> ReLU, then a 3x3 max-pool of stride 2, or a stride-2 conv instead."""
    torch.manual_seed(3)
    model = ViT(image_size=16, patch_size=1, in_channels=3, num_classes=10, dim=32, depth=1, num_heads=2,
                stem_channels=(8, 16), stem_pool=stem_pool).eval()
    x = torch.randn(2, 3, 16, 16)
    expected = x
    for conv, norm in zip(*[[m for m in model.stem.modules() if isinstance(m, kind)]
                            for kind in (torch.nn.Conv2d, torch.nn.BatchNorm2d)], strict=True):
        with torch.no_grad():
            norm.running_mean.uniform_(-0.5, 0.5), norm.running_var.uniform_(0.5, 2), norm.weight.uniform_(0.5, 2)
        expected = F.conv2d(expected, conv.weight, stride=1 if stem_pool else 2, padding=1)
        expected = (expected - norm.running_mean[:, None, None]) / (norm.running_var[:, None, None] + 1e-5).sqrt()
        expected = F.relu(expected * norm.weight[:, None, None] + norm.bias[:, None, None])
        expected = F.max_pool2d(expected, 3, stride=2, padding=1) if stem_pool else expected
    with torch.no_grad():
        assert torch.allclose(model.stem(x), expected, atol=1e-5)
    assert model.grid_size == (4, 4) and count_parameters(**model.config) == n_params(model)


def test_pool_tokens_rejects_a_bad_pool():
    with pytest.raises(ValueError, match="'max'"):
        pool_tokens(torch.zeros(1, 3, 2), "max")
    with pytest.raises(ValueError, match="class token"):
        pool_tokens(torch.zeros(1, 3, 2), "cls", 0)


MINIMAL = dict(image_size=16, patch_size=4, in_channels=3, num_classes=7, dim=24, depth=2, num_heads=3, mlp_ratio=2.0)


def test_minimal_vit_is_the_course_vit_without_options():
    """Chapter 05's MinimalViT and ViT's defaults: the same parameters (names, shapes, even the seeded initial values)
    and the same logits, so each loads the other's weights."""
    from vit_course import MinimalViT

    torch.manual_seed(0)
    minimal = MinimalViT(**MINIMAL).eval()
    torch.manual_seed(0)
    full = ViT(**MINIMAL).eval()
    assert {k: v.shape for k, v in minimal.state_dict().items()} == {k: v.shape for k, v in full.state_dict().items()}
    assert all(torch.equal(v, full.state_dict()[k]) for k, v in minimal.state_dict().items())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(minimal(x), full(x))
        assert minimal.embed(x).shape == (2, 17, 24)
    assert n_params(minimal) == count_parameters(**MINIMAL)
    assert len(layer_attentions(minimal, x)) == 2  # chapter 08's tools read it as they read a ViT


def test_minimal_vit_loads_the_shipped_cifar10_plain_run():
    """Chapter 05's payoff: the learner's class loads the course's trained weights and computes the shipped model's
    logits."""
    from vit_course import MinimalViT, load_pretrained

    model, checkpoint = load_pretrained("cifar10-plain")
    config = checkpoint["config"]
    names = inspect.signature(MinimalViT).parameters
    minimal = MinimalViT(**{k: config[k] for k in names}).eval()
    minimal.load_state_dict(checkpoint["model"])
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(minimal(x), model(x), atol=1e-6)


def test_the_photo_ships_with_the_package():
    from importlib import resources

    import numpy as np
    from PIL import Image

    photos = resources.files("vit_course") / "photos"
    with (photos / "chelsea.jpg").open("rb") as file:
        pixels = np.array(Image.open(file).convert("RGB"))
    assert pixels.shape == (224, 224, 3) and (photos / "chelsea.jpg").stat().st_size < 40_000
    assert "CC0" in (photos / "README.md").read_text()


def test_a_directly_built_vit_saves_and_rebuilds(tmp_path):
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=5, dim=32, depth=2, num_heads=4,
                mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=None).eval()
    images = torch.randn(3, 3, 16, 16)
    save_checkpoint(tmp_path / "vit.pt", model)
    rebuilt, state = load_checkpoint(tmp_path / "vit.pt")
    assert state["config"] == model.config and rebuilt.config == model.config
    assert torch.equal(rebuilt(images), model(images))
