"""The figures and explorers draw, on random small models and on the shipped checkpoints."""

import io
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import vit_course  # noqa: E402
import vit_course.batches  # noqa: E402
from vit_course import ViT, attention_distances, plots, position_embedding_similarity, widgets  # noqa: E402
from vit_course.interpret import pixels_per_token, run_model  # noqa: E402

CHECKPOINTS = Path(__file__).resolve().parents[1] / "vit_course" / "checkpoints"
CLASSES = [f"class {i}" for i in range(5)]

SMALL_MODELS = {
    "rgb-cls": dict(image_size=16, patch_size=4, in_channels=3),
    "grey-cls": dict(image_size=14, patch_size=7, in_channels=1),
    # a hybrid conv stem, mean pooling without a class token and fixed sin-cos positions, together
    "hybrid-mean-sincos": dict(image_size=16, patch_size=1, in_channels=3, stem_channels=(8, 8), pool="mean",
                               pos_embed="sincos"),
}


def small_model(name):
    torch.manual_seed(0)
    return ViT(num_classes=5, dim=16, depth=2, num_heads=2, **SMALL_MODELS[name]).eval()


def images_for(model, b=4):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (b, model.in_channels, *model.image_size), generator=g, dtype=torch.uint8)


def drawn(fig):
    """Render the figure (so every artist really draws), close it and return the PNG's size."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=30)
    plt.close(fig)
    return len(buffer.getvalue())


def draw_every_figure(model, images, labels, class_names, mean=None, std=None):
    _, attentions = run_model(model, vit_course.batches.normalize(images[:1], mean, std))
    inputs = vit_course.batches.normalize(images, mean, std)
    figures = [
        plots.plot_attention_maps(attentions, images[0], model.grid_size),
        plots.plot_rollout_grid(model, images, labels, class_names, mean, std, ncols=2),
        plots.plot_attention_distance(attention_distances(model, inputs), reference=3.0),
        plots.plot_position_similarity(model.pos_embed, model.grid_size),
        widgets.attention_view(model, images, labels, class_names, index=1, layer=-1, head=0, mode="attention",
                               mean=mean, std=std),
    ]
    stride = pixels_per_token(model)
    if all(side % stride == 0 for side in model.image_size):  # a hybrid's stride need not tile: MNIST's 8 px on 28
        figures.append(plots.plot_patch_grid(images[0], stride))
    if not model.config["stem_channels"]:
        figures.append(plots.plot_embedding_filters(model.patch_embed.proj.weight, model.patch_embed.patch_size,
                                                    model.in_channels))
    else:  # a hybrid embeds feature maps: its pixel-level filters are the stem's first convolution
        figures.append(plots.plot_embedding_filters(model.stem.layers[0].weight, 3, model.in_channels))
    for fig in figures:
        assert drawn(fig) > 1000


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_every_figure_draws_for_a_random_small_model(name):
    model = small_model(name)
    images = images_for(model)
    draw_every_figure(model, images, torch.tensor([0, 1, 2, 3]), CLASSES)
    if model.config["stem_channels"]:
        with pytest.raises(ValueError, match="8 channels"):
            plots.plot_embedding_filters(model.patch_embed.proj.weight, 1, 8)


def load_shipped(name):
    if not (CHECKPOINTS / name / "model.pt").is_file():
        pytest.skip(f"no shipped {name} checkpoint yet in {CHECKPOINTS / name} (trained by the data/training issue)")
    import vit_course.checkpoint
    import vit_course.train

    load = getattr(vit_course.train, "load_pretrained", None) or vit_course.checkpoint.load_pretrained
    return load(name)


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar10-plain", "cifar10-plain-basic"])
def test_every_figure_draws_for_the_shipped_models(name):
    loaded = load_shipped(name)
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    from vit_course.data import DATASETS
    from vit_course.recipes import RECIPES

    meta = DATASETS[RECIPES[name]["dataset"]]
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, *meta["shape"]), generator=g, dtype=torch.uint8)  # no dataset needed
    draw_every_figure(model.cpu().eval(), images, torch.arange(4), meta["classes"], meta["mean"], meta["std"])


# ---- what the figures show is what the tools computed ----

def test_position_similarity_figure_lays_out_the_tiles():
    pos = torch.randn(1, 1 + 6, 8)  # class token + a 2x3 grid
    fig = plots.plot_position_similarity(pos, (2, 3))
    canvas = fig.axes[0].images[0].get_array()
    sim = position_embedding_similarity(pos, (2, 3))
    torch.testing.assert_close(torch.tensor(canvas[3:5, 4:7].data).float(), sim[1, 1])  # tile (1, 1), after the gaps
    assert fig.axes[0].images[0].get_clim() == (-1.0, 1.0)  # the paper's colour range by default
    plt.close(fig)
    fig = plots.plot_position_similarity(pos, (2, 3), vmin=None)
    assert fig.axes[0].images[0].get_clim()[0] == pytest.approx(sim.min().item())
    plt.close(fig)


def test_distance_figure_puts_layers_on_x_and_one_dot_per_head():
    distances = torch.tensor([[1.0, 5.0, 9.0], [2.0, 6.0, 10.0]])  # 2 layers, 3 heads
    fig = plots.plot_attention_distance(distances)
    dots = [c.get_offsets() for c in fig.axes[0].collections]  # one collection per head
    assert len(dots) == 3
    torch.testing.assert_close(torch.tensor(dots[1]), torch.tensor([[1.0, 5.0], [2.0, 6.0]]), check_dtype=False)
    plt.close(fig)


def test_distance_figure_draws_models_side_by_side_on_one_scale():
    near, far = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[10.0, 20.0], [30.0, 40.0], [5.0, 6.0]])
    fig = plots.plot_attention_distance({"CutMix": near, "no CutMix": far}, reference=16.5)
    left, right = fig.axes
    assert (left.get_title(), right.get_title()) == ("CutMix", "no CutMix")
    torch.testing.assert_close(torch.tensor(right.collections[1].get_offsets()),
                               torch.tensor([[1.0, 20.0], [2.0, 40.0], [3.0, 6.0]]), check_dtype=False)
    assert left.get_ylim() == right.get_ylim() == (0, 44.0)  # one distance scale for both models
    plt.close(fig)


def test_deletion_figure_draws_each_ranking_in_percent():
    fig = plots.plot_deletion([0.1, 0.5], {"rollout": [0.6, 0.2], "random": [0.7, 0.4]}, clean=0.75)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["rollout"].get_xdata()) == [10.0, 50.0] and list(lines["random"].get_ydata()) == [70.0, 40.0]
    assert list(lines["nothing deleted"].get_ydata()) == [75.0, 75.0]
    plt.close(fig)


def test_deletion_figure_shades_the_band_of_other_random_draws():
    band = ([0.65, 0.3], [0.75, 0.45])  # lowest and highest accuracy of the other draws, per fraction
    fig = plots.plot_deletion([0.1, 0.5], {"rollout": [0.6, 0.35], "random": [0.7, 0.4]}, clean=0.8, band=band)
    ax = fig.axes[0]
    (shade,) = ax.collections
    corners = shade.get_paths()[0].vertices  # the polygon of the band, in percent
    assert {(round(x), round(y)) for x, y in corners} >= {(10, 65), (50, 30), (10, 75), (50, 45)}
    assert ax.get_ylim()[0] < 30 and "random, other draws" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_deletion_figure_tells_overlapping_lines_apart():
    curves = {"rollout": [0.6, 0.2], "last layer": [0.6, 0.2], "random": [0.7, 0.4], "centre": [0.5, 0.1],
              "patch norm": [0.7, 0.4]}  # two pairs of identical lines
    fig = plots.plot_deletion([0.1, 0.5], curves, clean=0.75)
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() in curves]
    styles = {(line.get_marker(), str(line.get_linestyle())) for line in lines}
    assert len(lines) == 5 and len(styles) == 5  # every ranking its own marker or dash, not only its colour
    plt.close(fig)


def colour_bars(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_attention_maps_carry_a_colour_bar_and_leave_the_image_visible():
    model = small_model("rgb-cls")
    images = images_for(model)
    _, attentions = run_model(model, images[:1].float() / 255)
    for fig in (plots.plot_attention_maps(attentions, images[0], model.grid_size),
                plots.plot_rollout_grid(model, images, torch.arange(4), CLASSES, ncols=2),
                widgets.attention_view(model, images, None, CLASSES, mode="rollout")):
        (bar,) = colour_bars(fig)
        assert bar.get_ylim() == (0.0, 1.0)
        plt.close(fig)
    heat = plots.OVERLAY["cmap"]
    assert heat(0.0)[3] < 0.2 < 0.8 < heat(1.0)[3]  # a low weight is nearly transparent, a high one opaque
    fig, ax = plt.subplots()
    shown = plots.show_overlay(ax, images[0], torch.zeros(16, 16))
    grey = ax.images[0].get_array()
    assert grey.ndim == 2 and shown is ax.images[1]  # the image in grey under the map; the map is returned
    plt.close(fig)


def test_filter_figure_labels_each_component_legibly():
    weight = torch.randn(32, 48, generator=torch.Generator().manual_seed(3))  # 32 filters over 4 x 4 x 3 patches
    fig = plots.plot_embedding_filters(weight, 4, 3, k=10, ncols=5)
    titles = [ax.title for ax in fig.axes if ax.get_title()]
    _, shares = vit_course.embedding_filters(weight, 4, 3, k=10)
    assert [t.get_text() for t in titles] == [f"{100 * s:.0f}%" if s >= 0.01 else f"{100 * s:.1f}%" for s in shares]
    assert min(t.get_fontsize() for t in titles) >= 8
    plt.close(fig)


def test_position_similarity_axes_count_from_zero_as_the_tensor_does():
    fig = plots.plot_position_similarity(torch.randn(1, 7, 8), (2, 3))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"] and "from 0" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1"]
    plt.close(fig)


def test_data_scaling_figure_draws_each_seed_the_mean_and_the_paired_lead():
    runs = [{"model": model, "seed": seed, "images": images, "test_accuracy": acc, "params": 10}
            for model, seed, images, acc in [("vit", 0, 500, 0.30), ("vit", 1, 500, 0.40), ("cnn", 1, 500, 0.60),
                                             ("cnn", 0, 500, 0.45), ("vit", 0, 5000, 0.60), ("vit", 1, 5000, 0.62),
                                             ("cnn", 0, 5000, 0.70), ("cnn", 1, 5000, 0.68)]]
    fig = plots.plot_data_scaling({"runs": runs})
    means = {line.get_label().split()[0]: line for line in fig.axes[0].get_lines() if line.get_linestyle() == "-"}
    assert list(means["vit"].get_xdata()) == [500, 5000]
    np.testing.assert_allclose(means["cnn"].get_ydata(), [52.5, 69.0])
    seeds = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "None"]
    assert sorted(y for line in seeds for y in line.get_ydata())[:2] == [30.0, 40.0]  # each run drawn
    (lead,) = [bars for bars in fig.axes[1].containers if bars.get_label() == "cnn"]
    line, _, (bars,) = lead.lines
    assert list(line.get_ydata()) == pytest.approx([17.5, 8.0])  # seed by seed: (15 + 20) / 2, (10 + 6) / 2
    bars = bars.get_segments()  # the seeds' range of the lead
    np.testing.assert_allclose([(seg[0][1], seg[1][1]) for seg in bars], [(15, 20), (6, 10)])
    plt.close(fig)


def test_pixels_and_model_inputs():
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1)
    torch.testing.assert_close(plots.to_pixels(images).flatten(), torch.tensor([0.0, 0.2, 1.0]))
    normalised = vit_course.batches.normalize(images, mean=(0.0, 0.2, 0.5), std=(1.0, 0.5, 0.25))
    torch.testing.assert_close(normalised.flatten(), torch.tensor([0.0, 0.0, 2.0]))
    shown = plots.to_pixels(torch.tensor([-2.0, 0.0, 2.0]).view(1, 3, 1, 1))  # normalised floats: own range
    torch.testing.assert_close(shown.flatten(), torch.tensor([0.0, 0.5, 1.0]))


# ---- explorers, driven without a browser ----

def test_patch_explorer_redraws_when_the_slider_moves():
    image = images_for(small_model("rgb-cls"))[0]  # (3, 16, 16)
    explorer = widgets.patch_explorer(image)
    slider = explorer.controls["patch_size"]
    assert list(slider.options) == [2, 4, 8]
    before, text = explorer.picture.value, explorer.text.value
    slider.value = 8
    assert explorer.picture.value != before and len(explorer.picture.value) > 1000
    assert "N = 4 tokens" in explorer.text.value and "5 x 5 = 25" in explorer.text.value and text != explorer.text.value
    slider.value = 2
    assert "N = 64 tokens" in explorer.text.value and "65 x 65 = 4,225" in explorer.text.value
    with pytest.raises(ValueError, match="16x16"):
        widgets.patch_explorer(image, patch_sizes=[3])
    assert drawn(widgets.patch_view(image, 4)) > 1000
    assert drawn(plots.plot_patch_sizes(image, [2, 4, 8])) > 1000


def test_attention_explorer_redraws_for_each_control():
    model = small_model("rgb-cls")
    images = images_for(model)
    explorer = widgets.attention_explorer(model, images, torch.tensor([0, 1, 2, 3]), CLASSES)
    controls = explorer.controls
    seen = {explorer.picture.value}
    for name, value in [("layer", 1), ("head", 1), ("image", 2), ("mode", "rollout"), ("layer", 2)]:
        controls[name].value = value
        assert explorer.picture.value not in seen, f"setting {name} = {value} did not redraw"
        seen.add(explorer.picture.value)
    assert controls["head"].disabled  # rollout averages the heads
    assert "rollout through layers 1-2" in explorer.text.value and "class 2" in explorer.text.value
    controls["mode"].value = "attention"
    assert not controls["head"].disabled and "layer 2, head 2" in explorer.text.value


def test_attention_view_rejects_bad_choices():
    model = small_model("rgb-cls")
    images = images_for(model)
    with pytest.raises(ValueError, match="mode"):
        widgets.attention_view(model, images, None, CLASSES, mode="raw")
    with pytest.raises(ValueError, match="head 5"):
        widgets.attention_view(model, images, None, CLASSES, head=5, mode="attention")
    depth = len(model.blocks)
    with pytest.raises(ValueError, match=f"layer {depth} does not exist"):  # not wrapped round to layer 0
        widgets.attention_view(model, images, None, CLASSES, layer=depth, mode="attention")
    with pytest.raises(ValueError, match=f"layer {-depth - 1} does not exist.*-{depth}..-1 from the end"):
        widgets.attention_view(model, images, None, CLASSES, layer=-depth - 1, mode="attention")
    with pytest.raises(IndexError, match=f"index {len(images)} is not one of the {len(images)} images"):
        widgets.attention_view(model, images, None, CLASSES, index=len(images))
    last = widgets.attention_view(model, images, None, CLASSES, index=-1)  # from the end, as in Python
    same = widgets.attention_view(model, images, None, CLASSES, index=len(images) - 1)
    shown = [[image.get_array().tolist() for ax in fig.axes for image in ax.images] for fig in (last, same)]
    assert shown[0] == shown[1] and shown[0]
    plt.close("all")


def test_image_plots_name_a_batch_or_channels_last():
    image = torch.zeros(3, 8, 8)
    for wrong, hint in [(image[None], "a batch, pass images\\[0\\]"), (image.permute(1, 2, 0), "channels last")]:
        for draw in (lambda x: plots.plot_patch_grid(x, 4), lambda x: plots.plot_patch_sizes(x, [2, 4]),
                     lambda x: widgets.patch_explorer(x)):
            with pytest.raises(ValueError, match=f"one image \\(C, H, W\\) of 1 or 3 channels, got shape .*{hint}"):
                draw(wrong)
    plt.close(plots.plot_patch_grid(image, 4))
