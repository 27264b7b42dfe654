"""Interactive explorers (ipywidgets 7.7 and 8): the attention explorer of chapter 08 and the patch
explorer of chapter 04, each with a static figure of the same view for where no widget front-end
runs (the book, nbval).

Each explorer returns a ``VBox`` with three extra attributes, so it can be driven without a browser:
``controls`` (name -> widget), ``update()`` (redraw now) and ``picture`` / ``text`` (the PNG image
widget and the HTML caption it redraws). Changing a control's ``value`` redraws at once.
"""

import io
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt

from .batches import normalize
from .interpret import attention_map, rollout_map, run_model
from .patches import patch_grid
from .plots import plot_patch_grid, show_image, show_overlay
from .plots.images import one_image

MODES = ("attention", "rollout")


def _png(fig):
    """Render a figure to PNG bytes and close it (the widget keeps only the picture)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _heat(attentions, grid_size, image_size, layer, head, mode, pool=None):
    """One image's map (H, W): raw class-token attention of ``head`` (None: mean of the heads) in
    ``layer`` (negative: from the end), or the rollout through layers 0..layer. attentions: L x (1, h, n, n)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    depth, heads = len(attentions), attentions[0].shape[1]
    if not -depth <= layer < depth:
        raise ValueError(f"layer {layer} does not exist: the model has layers 0..{depth - 1} (or -{depth}..-1 "
                         f"from the end)")
    layer %= depth
    if mode == "rollout":
        return rollout_map(attentions[:layer + 1], grid_size, image_size, pool=pool)[0]  # (H, W)
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"head {head} does not exist: the layer has heads 0..{heads - 1}")
    maps = attention_map(attentions[layer], grid_size, image_size, normalize=False, pool=pool)[0]  # (h, H, W)
    heat = maps.mean(0) if head is None else maps[head]  # (H, W)
    return heat / heat.max().clamp_min(1e-12)


def _attention_figure(image, heat, caption, subtitle):
    fig, (left, right) = plt.subplots(1, 2, figsize=(5.8, 2.8), layout="constrained")
    show_image(left, image, caption)
    bar = fig.colorbar(show_overlay(right, image, heat, subtitle), ax=right, shrink=0.9)
    bar.set_label("share of the map's largest", fontsize=8)
    return fig


def _describe(layer, head, mode):
    if mode == "rollout":
        return f"rollout through layers 1-{layer + 1}"
    return f"layer {layer + 1}, " + ("mean of the heads" if head is None else f"head {head + 1}")


def _caption(logits, label, class_names):
    probs = logits.softmax(-1)  # (classes,)
    pred = int(probs.argmax())
    mark = "" if label is None else ("✔ " if pred == int(label) else "✘ ")
    true = "" if label is None else f"{class_names[int(label)]} → "
    return f"{mark}{true}{class_names[pred]} ({100 * probs[pred]:.0f}%)"


def attention_view(model, images, labels, class_names, index=0, layer=-1, head=None, mode="rollout",
                   mean=None, std=None):
    """The static figure of the attention explorer: image ``index`` and, over it, the class token's
    attention in ``layer`` (``head``, or the mean of the heads for None) or the rollout through
    ``layer`` (negative layers count from the end, as in Python). Returns the Figure."""
    if not -len(images) <= index < len(images):
        raise IndexError(f"index {index} is not one of the {len(images)} images (0 to {len(images) - 1})")
    index = index % len(images)  # a negative index counts from the end
    logits, attentions = run_model(model, normalize(images[index:index + 1], mean, std))
    heat = _heat(attentions, model.grid_size, images.shape[-2:], layer, head, mode, model.pool)  # checks the layer
    layer %= len(attentions)  # a negative layer counts from the end, in the subtitle too
    label = None if labels is None else labels[index]
    return _attention_figure(images[index], heat, _caption(logits[0], label, class_names), _describe(layer, head, mode))


def attention_explorer(model, images, labels, class_names, mean=None, std=None):
    """Pick a test image, layer, head, and raw attention or rollout; the overlay redraws.

    Args:
        model: a trained ``ViT`` (run once over all images; the weights are kept on the CPU)
        images: (b, C, H, W) uint8 or float, a few dozen at most; labels (b,); class_names: list
        mean, std: the model's per-channel normalisation (``batches.normalize``)
    Returns: the widget (a VBox with ``controls``, ``update``, ``picture``, ``text``)
    """
    logits, attentions = run_model(model, normalize(images, mean, std))  # (b, classes), L x (b, h, n, n)
    depth, heads = len(attentions), attentions[0].shape[1]
    names = [f"{i}: {class_names[int(label)]}" for i, label in enumerate(labels)]
    controls = {
        "image": widgets.Dropdown(options=list(zip(names, range(len(images)), strict=True)), value=0,
                                  description="image"),
        "mode": widgets.ToggleButtons(options=list(MODES), value="attention", description="show"),
        "layer": widgets.IntSlider(value=depth, min=1, max=depth, description="layer"),
        "head": widgets.Dropdown(options=[("mean of heads", -1)] + [(f"head {h + 1}", h) for h in range(heads)],
                                 value=-1, description="head"),
    }
    picture, text = widgets.Image(format="png"), widgets.HTML()

    def update(change=None):
        i, mode = controls["image"].value, controls["mode"].value
        layer, head = controls["layer"].value - 1, controls["head"].value
        head = None if head < 0 else head
        controls["head"].disabled = mode == "rollout"  # rollout averages the heads by definition
        one = [a[i:i + 1] for a in attentions]  # L x (1, h, n, n)
        heat = _heat(one, model.grid_size, images.shape[-2:], layer, head, mode, model.pool)
        caption = _caption(logits[i], labels[i], class_names)
        picture.value = _png(_attention_figure(images[i], heat, caption, _describe(layer, head, mode)))
        text.value = f"<b>{caption}</b> &nbsp; {_describe(layer, head, mode)}"

    for control in controls.values():
        control.observe(update, names="value")
    update()
    box = widgets.VBox([widgets.HBox([controls["image"], controls["mode"]]),
                        widgets.HBox([controls["layer"], controls["head"]]), picture, text])
    box.controls, box.update, box.picture, box.text = controls, update, picture, text
    return box


def valid_patch_sizes(image_size):
    """Patch sizes that tile an (H, W) image, from 2 up to half the shorter side."""
    height, width = image_size
    return [p for p in range(2, min(height, width) // 2 + 1) if height % p == 0 and width % p == 0]


def patch_text(image_size, patch_size):
    """The explorer's caption: the patch grid, token count N and the attention matrix's size."""
    gh, gw = patch_grid(image_size, patch_size)
    n = gh * gw
    return (f"P = {patch_size}: {gh} x {gw} grid, N = {n} tokens; with the class token the attention "
            f"matrix is {n + 1} x {n + 1} = {(n + 1) ** 2:,} weights per head")


def patch_view(image, patch_size):
    """The static figure of the patch explorer at one patch size (the grid and the patch sequence)."""
    return plot_patch_grid(image, patch_size, title=patch_text(image.shape[-2:], patch_size).split(";")[0])


def patch_explorer(image, patch_sizes=None):
    """A patch-size slider over ``image`` (C, H, W): the grid, the token count N and the size of the
    attention matrix (N + 1)^2 update. patch_sizes: the slider's stops (default: every size from 2
    to half the image that tiles it). Returns the widget (``controls``, ``update``, ``picture``, ``text``)."""
    one_image(image, "patch_explorer")
    size = tuple(image.shape[-2:])
    patch_sizes = valid_patch_sizes(size) if patch_sizes is None else list(patch_sizes)
    bad = [p for p in patch_sizes if p < 1 or size[0] % p or size[1] % p]
    if not patch_sizes or bad:
        raise ValueError(f"patch sizes {bad or patch_sizes} do not tile a {size[0]}x{size[1]} image")
    slider = widgets.SelectionSlider(options=patch_sizes, value=patch_sizes[math.ceil(len(patch_sizes) / 2) - 1],
                                     description="patch size")
    picture, text = widgets.Image(format="png"), widgets.HTML()

    def update(change=None):
        p = slider.value
        picture.value = _png(patch_view(image, p))
        text.value = patch_text(size, p)

    slider.observe(update, names="value")
    update()
    box = widgets.VBox([slider, picture, text])
    box.controls, box.update, box.picture, box.text = {"patch_size": slider}, update, picture, text
    return box


__all__ = ["attention_explorer", "attention_view", "patch_explorer", "patch_text", "patch_view",
           "valid_patch_sizes"]
