"""The course's diagrams, drawn from shapes by the code below and embedded in the pages that show them.

A chapter asks for a picture with a marker line in a markdown cell, ``<!-- diagram: NAME -->`` (book/index.md,
plain markdown, the same). The line right after the marker is the picture itself, written here: an HTML
``<img src="data:image/png;base64,..." alt="..." width="...">``, a PNG drawn at twice its width for sharp
screens. The picture lives in the notebook (Colab has nothing else) and shows before any cell runs, in the book
(MyST's ``html_image``), JupyterLab and Colab; the student notebooks (``python -m tools.notebooks``) carry it over
unchanged. One palette (Okabe and Ito's, safe for colour-blind readers), one font, the course's notation.

Every PNG records, in a text chunk, the fingerprint of the code that drew it (this file, and the example image
two diagrams show). A picture is stale when that fingerprint is not the current one: so a change of notation is
one edit here and one command, and ``--check`` (run by ``make test`` and ``tests/test_diagrams.py``) fails
until it is made. Only a stale picture is redrawn, so another version of matplotlib, which may draw other bytes,
changes nothing. Output is deterministic: the same code and matplotlib give the same bytes.

    python -m tools.diagrams                 # redraw stale pictures, embed them, regenerate notebooks/
    python -m tools.diagrams --check         # exit 1 if a picture is stale or missing, or a marker unknown
    python -m tools.diagrams --out DIR       # also write every diagram as DIR/NAME.png
"""

import argparse
import base64
import functools
import hashlib
import io
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from vit_course.files import atomic_write, write_text

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- diagram: ([\w-]+) -->\s*$")
IMAGE = re.compile(r'^<img src="data:image/png;base64,([A-Za-z0-9+/=]*)" alt="([^"]*)" width="(\d+)">\s*$')
KEY = "vit-course diagram"  # the PNG text chunk holding "NAME FINGERPRINT"
SCALE = 2  # pixels drawn per pixel shown
COLOURS = 256  # the PNG's palette

# The palette (Okabe & Ito): one role, one colour, in every diagram; (edge, fill).
INK, MUTED = "#222222", "#5c5c5c"
TENSOR = ("#0072B2", "#dcebf7")  # data: activations, tokens, images' pixels
LEARNED = ("#E69F00", "#fcecc9")  # what training learns: weight matrices, layers with weights, position embeddings
OPERATION = ("#009E73", "#d3efe5")  # fixed operations: softmax, split, merge, +
CLASS = ("#CC79A7", "#f5e0ec")  # the class token
HEADS = [("#0072B2", "#cfe3f3"), ("#E69F00", "#fbe3b3"), ("#009E73", "#c6eadd"), ("#CC79A7", "#f2d5e6")]
GRID = 4  # the example image is cut into GRID x GRID patches (32 / 4 = 8 pixels a side)
EXAMPLE = 1  # the example image (vit_course.load_examples) shown as "the image": a dog


@dataclass(frozen=True)
class Box:
    """A rectangle in the diagram's coordinates (pixels as shown, y down)."""
    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self):
        return self.x + self.w / 2

    @property
    def cy(self):
        return self.y + self.h / 2

    @property
    def r(self):
        return self.x + self.w

    @property
    def b(self):
        return self.y + self.h


# ---- drawing primitives -----------------------------------------------------------------------------------------

def text(ax, x, y, s, size=10.5, color=INK, ha="center", va="center", **kw):
    ax.text(x, y, s, fontsize=size, color=color, ha=ha, va=va, **kw)


def box(ax, x, y, w, h, role, label=None, size=10.5, round_=4, lw=1.3, dashed=False):
    """A rounded box, top-left (x, y), filled in the role's colours, with a centred label. -> Box."""
    from matplotlib.patches import FancyBboxPatch

    edge, fill = role
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={round_}", lw=lw,
                                edgecolor=edge, facecolor=fill if not dashed else "none",
                                linestyle=(0, (4, 3)) if dashed else "-"))
    if label:
        text(ax, x + w / 2, y + h / 2, label, size=size)
    return Box(x, y, w, h)


def grid(ax, x, y, rows, cols, cell, role, colors=None, alphas=None, lw=0.6):
    """A matrix drawn as rows x cols cells, top-left (x, y); colors[r][c] or alphas[r][c] per cell. -> Box."""
    from matplotlib.patches import Rectangle

    edge, fill = role
    for r in range(rows):
        for c in range(cols):
            face = colors[r][c] if colors else fill
            ax.add_patch(Rectangle((x + c * cell, y + r * cell), cell, cell, facecolor=face, edgecolor="white",
                                   lw=lw, alpha=alphas[r][c] if alphas else 1.0))
    ax.add_patch(Rectangle((x, y), cols * cell, rows * cell, facecolor="none", edgecolor=edge, lw=1.2))
    return Box(x, y, cols * cell, rows * cell)


def arrow(ax, p, q, color=INK, lw=1.2, style="-|>"):
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(p, q, arrowstyle=style, mutation_scale=10, lw=lw, color=color,
                                 shrinkA=0, shrinkB=0, joinstyle="miter", capstyle="butt"))


def line(ax, points, color=INK, lw=1.2, dashed=False, zorder=2):
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, color=color, lw=lw, solid_capstyle="butt", linestyle=(0, (4, 3)) if dashed else "-",
            zorder=zorder)


def plus(ax, x, y, r=8, role=OPERATION):
    """The residual stream's "+" join: a circle with a plus sign."""
    from matplotlib.patches import Circle

    edge, fill = role
    ax.add_patch(Circle((x, y), r, facecolor=fill, edgecolor=edge, lw=1.3, zorder=3))
    line(ax, [(x - r * 0.55, y), (x + r * 0.55, y)], color=edge, lw=1.4, zorder=4)
    line(ax, [(x, y - r * 0.55), (x, y + r * 0.55)], color=edge, lw=1.4, zorder=4)


def labelled(ax, b, above=None, below=None, size=10.5, gap=9):
    """Text centred above and below a Box (a name above, a shape below, as everywhere in the course)."""
    if above:
        text(ax, b.cx, b.y - gap, above, size=size)
    if below:
        text(ax, b.cx, b.b + gap, below, size=size - 1, color=MUTED)


def weight(ax, x0, x1, y, label, shape=None, w=None, h=22):
    """A learned linear map on the arrow from (x0, y) to (x1, y): its name in an orange box above, its shape below."""
    arrow(ax, (x0, y), (x1, y))
    w = w or min(x1 - x0 - 16, 40)
    b = box(ax, (x0 + x1) / 2 - w / 2, y - h - 5, w, h, LEARNED, label)
    if shape:
        text(ax, b.cx, y + 12, shape, size=9, color=MUTED)
    return b


def example_image():
    """The example image as (32, 32, 3) floats in [0, 1]."""
    import numpy as np

    from vit_course.data import EXAMPLES
    with np.load(EXAMPLES) as stored:
        return stored["images"][EXAMPLE].transpose(1, 2, 0) / 255.0


def weights(rows, cols, seed):
    """A fixed table of attention-like weights: each row sums to 1 (for shading the weights matrix A)."""
    import numpy as np

    scores = np.random.default_rng(seed).normal(size=(rows, cols)) * 1.2
    scores += 1.5 * np.eye(rows, cols)
    e = np.exp(scores - scores.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# ---- the diagrams -------------------------------------------------------------------------------------------------

def attention_flow(ax):
    """Chapter 01: X -> Q, K, V -> scores -> softmax -> weights A -> A V."""
    c = 14  # one matrix cell; n = 4 tokens, D = 6, d = 2 drawn
    n, D, d = 4, 6, 2
    X = grid(ax, 24, 124, n, D, c, TENSOR)
    labelled(ax, X, "$X$", "$n \\times D$")
    text(ax, X.cx, X.y - 28, "tokens", size=9.5, color=MUTED)
    bus = X.r + 24
    line(ax, [(X.r, X.cy), (bus, X.cy)])
    rows = {"Q": 56, "K": 152, "V": 248}
    qkv = {}
    line(ax, [(bus, rows["Q"]), (bus, rows["V"])])
    for name, y in rows.items():
        b = grid(ax, 232, y - n * c / 2, n, d, c, TENSOR)
        qkv[name] = b
        weight(ax, bus, b.x - 2, y, f"$W_{name.lower()}$", "$D \\times d$")
        labelled(ax, b, f"${name}$", "$n \\times d$")
    S = grid(ax, 370, 104 - n * c / 2, n, n, c, TENSOR)
    arrow(ax, (qkv["Q"].r + 2, rows["Q"] + 6), (S.x - 2, S.y + 14))
    arrow(ax, (qkv["K"].r + 2, rows["K"] - 6), (S.x - 2, S.b - 14))
    text(ax, S.cx, S.y - 32, "scores", size=9.5, color=MUTED)
    labelled(ax, S, "$QK^{\\top}/\\sqrt{d}$", "$n \\times n$", gap=12)
    A = grid(ax, 560, S.y, n, n, c, TENSOR, colors=[[TENSOR[0]] * n] * n,
             alphas=(0.06 + 0.94 * weights(n, n, 3)).tolist())
    op = box(ax, S.r + 22, S.cy - 17, A.x - S.r - 44, 34, OPERATION)
    text(ax, op.cx, op.cy - 6, "softmax")
    text(ax, op.cx, op.cy + 8, "over keys", size=9, color=MUTED)
    arrow(ax, (S.r + 2, S.cy), (op.x - 1, S.cy))
    arrow(ax, (op.r + 1, S.cy), (A.x - 2, A.cy))
    text(ax, A.cx, A.y - 30, "weights", size=9.5, color=MUTED)
    labelled(ax, A, "$A$", "$n \\times n$")
    text(ax, A.r + 8, A.cy, "each row\nsums to 1", size=9, color=MUTED, ha="left", linespacing=1.3)
    out = grid(ax, A.cx - d * c / 2, rows["V"] - n * c / 2, n, d, c, TENSOR)
    labelled(ax, out, "$AV$", "$n \\times d$")
    text(ax, out.r + 8, out.cy, "output", size=9.5, color=MUTED, ha="left")
    arrow(ax, (A.cx, A.b + 18), (out.cx, out.y - 20))
    mul = (A.cx - 60, rows["V"])
    arrow(ax, (qkv["V"].r + 2, rows["V"]), (out.x - 2, rows["V"]))
    text(ax, (qkv["V"].r + mul[0]) / 2 + 20, rows["V"] + 16,
         "output row $i$ $= \\sum_j A_{ij}\\,$(row $j$ of $V$)", size=9.5, color=MUTED)


def heads_split_merge(ax):
    """Chapter 02: the width D = h d cut into h heads, attention in each, merged back, then W_o."""
    h, d, n = len(HEADS), 2, 4
    D = h * d
    big = 24  # the token row at the top
    text(ax, 20, 22, "one token's row of $D = h \\cdot d$ numbers, cut into $h$ heads of $d$ numbers each:",
         ha="left")
    x0 = 140
    for k, (edge, fill) in enumerate(HEADS):
        b = grid(ax, x0 + k * (d * big + 18), 40, 1, d, big, (edge, fill))
        text(ax, b.cx, b.b + 11, f"head {k}" if k < h - 1 else "head $h{-}1$", size=9.5, color=edge)
    text(ax, x0 + h * (d * big + 18) + 6, 52, "$h \\cdot d = D$", ha="left", size=10.5)
    colors = [[HEADS[col // d][1] for col in range(D)] for _ in range(n)]
    strong = [[HEADS[col // d][0] for col in range(D)] for _ in range(n)]
    c, top, mid = 11, 110, 212
    X = grid(ax, 18, mid - n * c / 2, n, D, c, TENSOR, colors=colors)
    labelled(ax, X, "$Q$ (and $K$, $V$)", "$(b, n, D)$")
    gap = 10
    heads_in, heads_out = [], []
    for k, (edge, fill) in enumerate(HEADS):
        y = top + k * (n * c + gap)
        heads_in.append(grid(ax, 190, y, n, d, c, (edge, fill), colors=[[fill] * d] * n))
        heads_out.append(grid(ax, 372, y, n, d, c, (edge, fill), colors=[[edge] * d] * n,
                              alphas=[[0.55] * d] * n))
    text(ax, (X.r + heads_in[0].x) / 2, top + 4, "split", color=OPERATION[0])
    text(ax, heads_in[0].cx, heads_in[-1].b + 14, "$(b, h, n, d)$", size=9.5, color=MUTED)
    text(ax, heads_out[0].cx, heads_out[-1].b + 14, "$(b, h, n, d)$", size=9.5, color=MUTED)
    for k, (a, b) in enumerate(zip(heads_in, heads_out, strict=True)):
        op = box(ax, a.r + 22, a.cy - 12, b.x - a.r - 44, 24, OPERATION, "attention", size=9.5)
        arrow(ax, (a.r + 2, a.cy), (op.x - 1, a.cy))
        arrow(ax, (op.r + 1, a.cy), (b.x - 2, b.cy))
        arrow(ax, (X.r + 4, X.cy), (a.x - 4, a.cy), color=HEADS[k][0], lw=1.0)
    text(ax, (heads_in[0].r + heads_out[0].x) / 2, top - 14,
         "each head on its own: softmax$(QK^{\\top}/\\sqrt{d})\\,V$", size=9.5, color=MUTED)
    M = grid(ax, 470, mid - n * c / 2, n, D, c, TENSOR, colors=strong, alphas=[[0.55] * D] * n)
    for k, b in enumerate(heads_out):
        arrow(ax, (b.r + 4, b.cy), (M.x - 4, M.cy), color=HEADS[k][0], lw=1.0)
    text(ax, (heads_out[0].r + M.x) / 2, top + 4, "merge", color=OPERATION[0])
    labelled(ax, M, None, "$(b, n, D)$")
    out = grid(ax, 606, mid - n * c / 2, n, D, c, TENSOR)
    weight(ax, M.r + 2, out.x - 2, M.cy, "$W_o$", "proj", w=32)
    labelled(ax, out, "output", "$(b, n, D)$")


def branch(ax, stream, y0, y1, column, boxes, w=96, h=30, gap=12):
    """A residual branch: leaves the stream at y0, runs through ``boxes`` (labels) stacked in ``column``, and joins
    the stream again at a "+" at y1. -> the Boxes."""
    top = y0 + 18
    line(ax, [(stream, y0), (column, y0)])
    drawn = []
    for k, label in enumerate(boxes):
        y = top + k * (h + gap)
        arrow(ax, (column, y - (18 if k == 0 else gap)), (column, y - 1))
        drawn.append(box(ax, column - w / 2, y, w, h, LEARNED, label))
    bottom = drawn[-1].b
    line(ax, [(column, bottom), (column, y1)])
    arrow(ax, (column, y1), (stream + 9, y1))
    plus(ax, stream, y1)
    return drawn


def stream_segment(ax, x, y0, y1, head=False):
    """A piece of the residual stream: a thick straight line (an arrow at its end)."""
    if head:
        arrow(ax, (x, y0), (x, y1), color=TENSOR[0], lw=2.2)
    else:
        line(ax, [(x, y0), (x, y1)], color=TENSOR[0], lw=2.2)


def post_pre_block(ax, x, top, pre=True, column_dx=110):
    """One encoder block on a vertical residual stream at x, from y=top; pre-norm (ViT) or post-norm (2017).
    -> the y where the block's output leaves."""
    col = x + column_dx
    if pre:
        y = top
        stream_segment(ax, x, y, y + 112)
        branch(ax, x, y + 8, y + 120, col, ["LN", "MHA"])
        stream_segment(ax, x, y + 128, y + 240)
        branch(ax, x, y + 136, y + 248, col, ["LN", "MLP"])
        return y + 256
    y = top
    stream_segment(ax, x, y, y + 70)
    branch(ax, x, y + 8, y + 78, col, ["MHA"])
    stream_segment(ax, x, y + 86, y + 100)
    box(ax, x - 30, y + 101, 60, 26, LEARNED, "LN")
    stream_segment(ax, x, y + 127, y + 198)
    branch(ax, x, y + 136, y + 206, col, ["MLP"])
    stream_segment(ax, x, y + 214, y + 228)
    box(ax, x - 30, y + 229, 60, 26, LEARNED, "LN")
    return y + 256


def pre_post_norm(ax):
    """Chapter 03: post-norm (the original Transformer) and pre-norm (ViT) blocks, side by side."""
    post = "$x \\leftarrow \\mathrm{{LN}}(x + \\mathrm{{{}}}(x))$"
    pre_ = "$x \\leftarrow x + \\mathrm{{{}}}(\\mathrm{{LN}}(x))$"
    for x, pre, title, note, formulas in (
            (100, False, "post-norm", "the original Transformer", [post.format("MHA"), post.format("MLP")]),
            (450, True, "pre-norm", "ViT", [pre_.format("MHA"), pre_.format("MLP")])):
        text(ax, x + 55, 20, title, size=12, weight="bold")
        text(ax, x + 55, 38, note, size=9.5, color=MUTED)
        text(ax, x - 12, 66, "$(b, n, D)$", size=9.5, color=MUTED, ha="right")
        text(ax, x + 8, 60, "$x$", size=10.5, ha="left")
        end = post_pre_block(ax, x, 72, pre)
        stream_segment(ax, x, end, end + 26, head=True)
        text(ax, x - 12, end + 18, "$(b, n, D)$", size=9.5, color=MUTED, ha="right")
        for k, formula in enumerate(formulas):
            text(ax, x + 55, end + 50 + 20 * k, formula, size=10.5)
    line(ax, [(350, 14), (350, 400)], color="#d0d0d0", lw=1.0)
    text(ax, 8, 118, "residual\nstream", size=9, color=TENSOR[0], ha="left", linespacing=1.3)


def patch_image(ax, x, y, size, numbers=True, fontsize=8):
    """The example image at (x, y), size pixels square, cut by white lines into GRID x GRID patches numbered from 0
    row by row. -> Box."""
    image = example_image()
    ax.imshow(image, extent=(x, x + size, y + size, y), interpolation="nearest", zorder=1)
    step = size / GRID
    for k in range(1, GRID):
        line(ax, [(x + k * step, y), (x + k * step, y + size)], color="white", lw=1.6, zorder=2)
        line(ax, [(x, y + k * step), (x + size, y + k * step)], color="white", lw=1.6, zorder=2)
    if numbers:
        for k in range(GRID * GRID):
            r, c = divmod(k, GRID)
            ax.text(x + (c + 0.5) * step, y + (r + 0.5) * step, str(k), fontsize=fontsize, ha="center",
                    va="center", color="white", fontweight="bold", zorder=3,
                    path_effects=[_stroke()])
    ax.set_xlim(0, ax.figure.get_figwidth() * 100)
    ax.set_ylim(ax.figure.get_figheight() * 100, 0)
    return Box(x, y, size, size)


def _stroke():
    from matplotlib import patheffects

    return patheffects.withStroke(linewidth=2.2, foreground="#333333")


def patch_rows(ax, x, y, row_h, px):
    """The flattened patches: patch k's pixels, row after row, laid out as row k (px pixels wide each). -> Box."""
    image = example_image()
    side = image.shape[0] // GRID
    rows = []
    for k in range(GRID * GRID):
        r, c = divmod(k, GRID)
        rows.append(image[r * side:(r + 1) * side, c * side:(c + 1) * side].reshape(1, side * side, 3))
    import numpy as np

    strip = np.concatenate(rows)  # (N, P*P, 3): each row one patch
    width = side * side * px
    ax.imshow(strip, extent=(x, x + width, y + len(rows) * row_h, y), interpolation="nearest", aspect="auto",
              zorder=1)
    for k in range(1, len(rows)):
        line(ax, [(x, y + k * row_h), (x + width, y + k * row_h)], color="white", lw=1.0, zorder=2)
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), width, len(rows) * row_h, facecolor="none", edgecolor=TENSOR[0], lw=1.2,
                           zorder=3))
    return Box(x, y, width, len(rows) * row_h)


def image_to_tokens(ax):
    """Chapter 04: image -> numbered patches -> flattened rows -> linear E -> tokens -> class token -> + positions."""
    N, c, cols, mid = GRID * GRID, 8, 5, 122  # c: a token cell; cols: the D drawn
    img = patch_image(ax, 12, mid - 64, 128, fontsize=7.5)
    labelled(ax, img, "image", "$(C, H, W)$")
    text(ax, img.x - 6, img.b + 28, f"$N = HW/P^2$ patches ({GRID} × {GRID} here)", size=9, color=MUTED, ha="left")
    row_h = 8
    flat = patch_rows(ax, 238, mid - N * row_h / 2, row_h, 1.5)
    for k in (0, 1, N - 1):
        text(ax, flat.x - 4, flat.y + (k + 0.5) * row_h, str(k), size=7, color=MUTED, ha="right")
    text(ax, flat.x - 6, flat.y + 8.5 * row_h, "⋮", size=8, color=MUTED, ha="right")
    labelled(ax, flat, "patches, flattened", "$(N, P^2C)$", gap=11)
    arrow(ax, (img.r + 4, img.cy), (flat.x - 16, img.cy))
    text(ax, (img.r + flat.x) / 2 - 6, img.cy - 12, "cut, flatten", size=9, color=OPERATION[0])
    T = grid(ax, 436, flat.y, N, cols, c, TENSOR)
    weight(ax, flat.r + 3, T.x - 3, flat.cy, "$E$", "$P^2C \\times D$")
    labelled(ax, T, "tokens", "$(N, D)$", gap=11)
    Z = grid(ax, 532, flat.y - c, N + 1, cols, c, TENSOR, colors=[[CLASS[1]] * cols] + [[TENSOR[1]] * cols] * N)
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((Z.x, Z.y), Z.w, c, facecolor="none", edgecolor=CLASS[0], lw=1.4, zorder=3))
    arrow(ax, (T.r + 3, T.cy), (Z.x - 3, T.cy))
    text(ax, (T.r + Z.x) / 2, T.cy - 12, "prepend", size=8.5, color=OPERATION[0])
    text(ax, Z.cx, Z.y - 11, "class token", size=9.5, color=CLASS[0])
    labelled(ax, Z, None, "$(N{+}1, D)$", gap=11)
    P = grid(ax, 620, Z.y, N + 1, cols, c, LEARNED)
    plus(ax, (Z.r + P.x) / 2, Z.cy)
    text(ax, P.cx, P.y - 20, "position\nembeddings", linespacing=1.1)
    labelled(ax, P, None, "$(N{+}1, D)$", gap=11)


def patch_tiles(ax, x, y, tile, gap):
    """The example image's patches in a row, in their order. -> Box."""
    image = example_image()
    side = image.shape[0] // GRID
    for k in range(GRID * GRID):
        r, c = divmod(k, GRID)
        left = x + k * (tile + gap)
        ax.imshow(image[r * side:(r + 1) * side, c * side:(c + 1) * side], extent=(left, left + tile, y + tile, y),
                  interpolation="nearest", zorder=1)
    ax.set_xlim(0, ax.figure.get_figwidth() * 100)
    ax.set_ylim(ax.figure.get_figheight() * 100, 0)
    return Box(x, y, GRID * GRID * (tile + gap) - gap, tile)


def vit_overview(ax):
    """Chapter 05 and the landing page: the whole ViT, top to bottom, shapes alongside; one block in detail."""
    N, cx, shape_x = GRID * GRID, 250, 84

    def shape(y, s):
        text(ax, shape_x, y, s, size=9.5, color=MUTED, ha="right")

    def down(y0, y1, label=None):
        arrow(ax, (cx, y0), (cx, y1))
        if label:
            text(ax, cx + 8, (y0 + y1) / 2, label, size=9, color=OPERATION[0], ha="left")

    img = patch_image(ax, cx - 32, 12, 64, numbers=False)
    shape(img.cy, "$(b, C, H, W)$")
    text(ax, img.r + 10, img.cy, "image", ha="left")
    down(img.b + 4, 100, "cut into $N$ patches, flatten")
    tiles = patch_tiles(ax, cx - (N * 19 - 3) / 2, 104, 16, 3)
    shape(tiles.cy, "$(b, N, P^2C)$")
    down(tiles.b + 4, 142)
    e = box(ax, tiles.x, 146, tiles.w, 24, LEARNED, "patch embedding $E$ (linear)")
    shape(e.cy, "$(b, N, D)$")
    down(e.b + 4, 192)
    step = (tiles.w + 2) / (N + 1)
    for k in range(N + 1):
        box(ax, tiles.x + k * step, 196, step - 2, step - 2, CLASS if k == 0 else TENSOR, round_=2, lw=1.0)
        box(ax, tiles.x + k * step, 196 + step + 4, step - 2, 8, LEARNED, round_=1, lw=1.0)
    text(ax, tiles.x - 2, 186, "class token", size=9, color=CLASS[0], ha="left")
    text(ax, tiles.x - 2, 196 + step + 20, "+ position embeddings", size=9, color=LEARNED[0], ha="left")
    shape(196 + step / 2, "$(b, N{+}1, D)$")
    enc = box(ax, tiles.x, 262, tiles.w, 44, LEARNED)
    text(ax, enc.cx, enc.cy, "encoder block", size=11)
    text(ax, enc.r - 8, enc.cy, "$\\times L$", size=11, ha="right")
    down(196 + step + 14, enc.y - 2)
    shape(enc.cy, "$(b, N{+}1, D)$")
    down(enc.b + 4, 326)
    ln = box(ax, cx - 40, 330, 80, 24, LEARNED, "LN")
    shape(ln.cy, "$(b, N{+}1, D)$")
    down(ln.b + 4, 378, "take the class token")
    token = box(ax, cx - step / 2, 382, step - 2, step - 2, CLASS, round_=2, lw=1.0)
    shape(token.cy, "$(b, D)$")
    down(token.b + 4, 420)
    head = box(ax, cx - 60, 424, 120, 24, LEARNED, "head (linear)")
    down(head.b + 4, 466)
    scores = [0.25, 0.1, 0.3, 0.55, 0.2, 0.95, 0.15, 0.35, 0.1, 0.2]
    for k, v in enumerate(scores):
        box(ax, cx - 50 + k * 10, 500 - 30 * v, 8, 30 * v, TENSOR, round_=0.5, lw=0.8)
    line(ax, [(cx - 54, 500), (cx + 54, 500)], color=MUTED, lw=0.8)
    text(ax, cx + 62, 488, "class scores", ha="left")
    shape(488, "$(b, \\mathrm{classes})$")
    # one block, in detail: the frame, its ties to the stack, the pre-norm block inside
    frame = box(ax, 456, 150, 236, 340, LEARNED, dashed=True, round_=8)
    line(ax, [(enc.r, enc.y), (frame.x, frame.y)], color=LEARNED[0], lw=1.0, dashed=True)
    line(ax, [(enc.r, enc.b), (frame.x, frame.b)], color=LEARNED[0], lw=1.0, dashed=True)
    text(ax, frame.cx, frame.y + 18, "one encoder block", size=10.5, weight="bold")
    text(ax, frame.r - 10, frame.b - 14, "repeated $L$ times", size=9, color=MUTED, ha="right")
    stream = 500
    text(ax, stream + 8, 200, "$(b, N{+}1, D)$", size=9.5, color=MUTED, ha="left")
    end = post_pre_block(ax, stream, 206, pre=True, column_dx=114)
    stream_segment(ax, stream, end, end + 18, head=True)


@dataclass(frozen=True)
class Diagram:
    draw: object  # draw(ax): on axes whose units are pixels as shown, y down
    width: int  # pixels as shown (the <img> width); drawn at SCALE times that
    height: int
    alt: str  # short: a chapter's words are counted


DIAGRAMS = {d.draw.__name__: d for d in (
    Diagram(attention_flow, 700, 300, "Self-attention: X (n, D) times W_q, W_k, W_v gives Q, K, V (n, d); the softmax "
            "over keys of QK^T / sqrt(d) gives weights A (n, n); the output is AV (n, d)."),
    Diagram(heads_split_merge, 700, 340, "Multi-head attention: the width D = h d is split into h heads, (b, n, D) to "
            "(b, h, n, d); each head attends on its own; the heads are merged to (b, n, D) and projected by W_o."),
    Diagram(pre_post_norm, 700, 420, "Post-norm blocks, x = LN(x + MHA(x)), beside pre-norm blocks (ViT), "
            "x = x + MHA(LN(x)), on a residual stream of shape (b, n, D)."),
    Diagram(image_to_tokens, 700, 246, "An image (C, H, W) cut into N = HW/P^2 patches numbered from 0, flattened to "
            "(N, P^2 C), projected by E to tokens (N, D); a class token and position embeddings give (N+1, D)."),
    Diagram(vit_overview, 700, 520, "The ViT: image (b, C, H, W), patches (b, N, P^2 C), patch embedding (b, N, D), "
            "class token and positions (b, N+1, D), L pre-norm encoder blocks, LN, the class token (b, D), the head, "
            "class scores (b, classes)."),
)}


# ---- rendering and fingerprints -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def fingerprint():
    """What the pictures are drawn from: this file's code and the example image. 16 hex digits."""
    from vit_course.data import EXAMPLES

    digest = hashlib.sha256(Path(__file__).read_text(encoding="utf-8").replace("\r\n", "\n").encode())
    digest.update(Path(EXAMPLES).read_bytes())
    return digest.hexdigest()[:16]


def render(name):
    """The PNG bytes of diagram ``name``: deterministic, with "NAME FINGERPRINT" in its text chunk."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    spec = DIAGRAMS[name]
    style = {"font.family": "DejaVu Sans", "mathtext.fontset": "dejavusans", "font.size": 10.5,
             "savefig.facecolor": "white", "path.simplify": False}
    with matplotlib.rc_context(style):
        fig = Figure(figsize=(spec.width / 100, spec.height / 100), dpi=100 * SCALE)
        FigureCanvasAgg(fig)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, spec.width)
        ax.set_ylim(spec.height, 0)
        ax.set_axis_off()
        spec.draw(ax)
        drawn = io.BytesIO()
        fig.savefig(drawn, format="png", dpi=100 * SCALE, metadata={"Software": None})
    return _compact(drawn.getvalue(), f"{name} {fingerprint()}")


def _compact(png, stamp):
    """A drawn PNG reduced to a palette of COLOURS (a few flat colours and their anti-aliased edges; about a third
    of the bytes), no dithering, with ``stamp`` as its only text chunk. Deterministic."""
    from PIL import Image, PngImagePlugin

    image = Image.open(io.BytesIO(png)).convert("RGB")
    quantized = image.quantize(colors=COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    info = PngImagePlugin.PngInfo()
    info.add_text(KEY, stamp)
    out = io.BytesIO()
    quantized.save(out, format="PNG", optimize=True, pnginfo=info)
    return out.getvalue()


def png_text(png):
    """A PNG's tEXt chunks as {keyword: text} (none if it is not a PNG)."""
    found, pos = {}, 8
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        return found
    while pos + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"tEXt":
            keyword, _, value = png[pos + 8:pos + 8 + length].partition(b"\0")
            found[keyword.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    return found


def image_line(name, png):
    spec = DIAGRAMS[name]
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{spec.alt}" width="{spec.width}">'


def problem(name, image):
    """Why the line after marker ``name`` is not its current picture (None if it is)."""
    if name not in DIAGRAMS:
        return f"unknown diagram '{name}' (known: {', '.join(DIAGRAMS)})"
    match = IMAGE.match(image or "")
    if not match:
        return f"diagram '{name}' is missing (the line after its marker is not its <img>)"
    spec = DIAGRAMS[name]
    if (match[2], int(match[3])) != (spec.alt, spec.width):
        return f"diagram '{name}': its alt text or width is not the current one"
    try:
        stamp = png_text(base64.b64decode(match[1], validate=True)).get(KEY)
    except (ValueError, struct.error):
        stamp = None
    if stamp != f"{name} {fingerprint()}":
        return f"diagram '{name}' is stale (drawn as '{stamp}', the code is now {fingerprint()})"
    return None


def embed(source, draw=render, where="text"):
    """A markdown text with each marker followed by its current picture. -> (new text, [problems found]).

    A current picture is kept as it is; a stale or missing one is drawn with ``draw(name)``; a blank line
    follows each picture (so the markdown after it is not read as part of the HTML). Unknown markers are
    reported, not touched.
    """
    lines, out, problems = source.split("\n"), [], []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        marker = MARKER.match(lines[i])
        i += 1
        if not marker:
            continue
        name = marker[1]
        following = lines[i] if i < len(lines) else None
        issue = problem(name, following)
        has_image = following is not None and following.startswith("<img src=\"data:image/png;base64,")
        if issue:
            problems.append(f"{where}: {issue}")
            if name not in DIAGRAMS:
                continue
            out.append(image_line(name, draw(name)))
        else:
            out.append(following)
        i += has_image
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out), problems


def pages(root):
    """The files that may hold markers: the solution notebooks and the book's landing page."""
    root = Path(root)
    found = sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))
    return found + [p for p in [root / "book" / "index.md"] if p.is_file()]


def refresh(path, check=False, draw=render):
    """Embed the current pictures in one file (a notebook's markdown cells, or a markdown page).

    -> the problems found (empty: nothing to do). Writes only when not ``check`` and something changed;
    raises ValueError on an unknown marker when writing.
    """
    path = Path(path)
    problems = []
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown" and "<!-- diagram:" in cell.source:
                new, found = embed(cell.source, draw, f"{path.name}, cell {index}")
                problems += found
                cell.source = new
        text_out = nbformat.writes(nb) + "\n"  # as tools.notebooks writes them
    else:
        text_out, problems = embed(path.read_text(encoding="utf-8"), draw, path.name)
    unknown = [p for p in problems if "unknown diagram" in p]
    if not check and problems:
        if unknown:
            raise ValueError("; ".join(unknown))
        write_text(path, text_out)
    return problems


def generate(root=ROOT, check=False, log=print):
    """Refresh every page's pictures (or with check=True only report). -> the problems found."""
    draw = functools.lru_cache(maxsize=None)(render)
    problems = []
    for path in pages(root):
        problems += refresh(path, check, draw)
    for issue in problems:
        log(f"{'stale' if check else 'redrawn'}: {issue}")
    return problems


def write_previews(out, names=None):
    """Write each diagram as out/NAME.png. -> the paths."""
    paths = []
    for name in names or DIAGRAMS:
        png = render(name)
        paths.append(atomic_write(Path(out) / f"{name}.png", lambda f, png=png: f.write(png)))
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.diagrams", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a picture is stale or missing, or a marker unknown; write nothing")
    parser.add_argument("--out", type=Path, help="also write every diagram as OUT/NAME.png")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.out:
        for path in write_previews(args.out):
            print(f"wrote {path}")
    if args.check:
        if generate(args.root, check=True):
            print("diagrams are out of date: run `python -m tools.diagrams`", file=sys.stderr)
            return 1
        return 0
    try:
        generate(args.root)
    except ValueError as err:
        print(f"python -m tools.diagrams: {err}", file=sys.stderr)
        return 1
    from tools import notebooks  # the student notebooks carry the pictures over
    notebooks.generate(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
