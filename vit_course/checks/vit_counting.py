"""Check of vit_course/vit.py's parameter count (chapter 05): count_parameters, by formula, with the hints of the
usual omissions."""

import numbers

from .. import vit as ref
from .core import check
from .probes import TorchCalls

CONFIGS = [
    ref.CONFIGS["ViT-B/16"],
    ref.CONFIGS["ViT-Ti/16"],
    dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=64, depth=3, num_heads=4, mlp_ratio=2.0),
    dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=96, depth=5, num_heads=3, mlp_ratio=3.0),
]
OPTIONS = [dict(CONFIGS[2], **options) for options in (
    dict(pos_embed="sincos"), dict(pool="mean"), dict(pool="mean", class_token=True), dict(qkv_bias=False),
    dict(init_values=0.1), dict(pool="mean", pos_embed="sincos"))]


def _patches(cfg):
    """N, the patches of the image or, for a hybrid, of the stem's map (each stage: n -> ceil(n / 2))."""
    height, width = ref.to_pair(cfg["image_size"])
    for _ in cfg.get("stem_channels") or ():
        height, width = (height + 1) // 2, (width + 1) // 2
    return (height // cfg["patch_size"]) * (width // cfg["patch_size"])


def _mistakes(cfg):
    """(hint, parameters the mistake leaves out) for one configuration."""
    d, depth, classes = cfg["dim"], cfg["depth"], cfg["num_classes"]
    hidden, n = int(d * cfg.get("mlp_ratio", 4.0)), _patches(cfg)
    p2c = cfg["patch_size"] ** 2 * cfg["in_channels"]
    return [
        ("the class token (1 x D) is not counted, or its row of the position table ((N + 1) x D)", d),
        ("the position embeddings ((N + 1) x D) are not counted", (n + 1) * d),
        ("the class token and its position row are both missing", 2 * d),
        ("the patch projection's bias (D) is not counted", d),
        ("the patch projection (P*P*C x D weights + D biases) is not counted", p2c * d + d),
        ("the biases of the blocks' Linear layers are not counted (qkv 3D, proj D, fc1 hidden, fc2 D per block)",
         depth * (5 * d + hidden)),
        ("the biases are not counted (patch projection D; qkv 3D, proj D, fc1 hidden, fc2 D per block)",
         depth * (5 * d + hidden) + d),
        ("the biases are not counted (patch projection D; qkv 3D, proj D, fc1 hidden, fc2 D per block; head)",
         depth * (5 * d + hidden) + d + classes),
        ("the qkv bias (3D per block) is not counted", depth * 3 * d),
        ("the LayerNorms (2 x 2D per block) are not counted", depth * 4 * d),
        ("the LayerNorms are not counted (2 x 2D per block, plus 2D for the final norm)", depth * 4 * d + 2 * d),
        ("the final LayerNorm (2D) is not counted", 2 * d),
        ("the LayerNorms are counted with weights only (D each, no bias)", depth * 2 * d + d),
        ("the head (D x classes + classes) is not counted", d * classes + classes),
        ("the head's bias is not counted", classes),
        ("the attention output projection proj (D x D + D per block) is not counted", depth * (d * d + d)),
        ("every block's parameters are counted once only: multiply by depth", (depth - 1) * (
            4 * d + 4 * d * d + 4 * d + 2 * d * hidden + hidden + d)),
    ]


def _option_mistakes(cfg):
    """(hint, parameters the mistake leaves out; negative: counted too many) for the optional arguments."""
    d, depth = cfg["dim"], cfg["depth"]
    pool, learned = cfg.get("pool", "cls"), cfg.get("pos_embed", "learned") == "learned"
    class_token = pool == "cls" if cfg.get("class_token") is None else cfg["class_token"]
    n = _patches(cfg) + class_token
    hints = []
    if not learned:
        hints.append(("a sin-cos position table is a buffer, not a parameter: count the (N + 1) x D table only "
                      "for pos_embed='learned'", -n * d))
    if pool == "mean" and not class_token:
        hints.append(("with pool='mean' there is no class token unless class_token=True (it defaults to "
                      "pool == 'cls'): no cls_token, and no position row for it", -(1 + learned) * d))
    if pool == "mean" and class_token:
        hints.append(("class_token=True adds a class token even with pool='mean': cls_token (D) and its position "
                      "row", (1 + learned) * d))
    if cfg.get("qkv_bias") is False:
        hints.append(("qkv_bias=False: the qkv layers have no bias (3D fewer per block)", -3 * d * depth))
    if cfg.get("init_values"):
        hints.append(("with init_values set every block has two LayerScales, ls1.gamma and ls2.gamma (D each)",
                      2 * d * depth))
    return hints


def _hint(cfg, expected, got):
    hidden = int(cfg["dim"] * cfg.get("mlp_ratio", 4.0))
    hidden_wrong = cfg["depth"] * (2 * cfg["dim"] + 1) * (hidden - 4 * cfg["dim"])
    hints = _stem_mistakes(cfg) + _option_mistakes(cfg) + _mistakes(cfg) + [
        ("the MLP width ignores mlp_ratio: hidden = int(dim * mlp_ratio)", hidden_wrong)]
    short = [text for text, missing in hints if missing and expected - got == missing]
    extra = [text for text, missing in hints if missing and got - expected == missing]
    if short:  # several slips can leave out the same number (D, 2D): name them all rather than guess one
        return short[0] if len(short) == 1 else "one of these (each leaves out that many): " + "; or ".join(short)
    if extra:
        return f"{got - expected:,.0f} too many, exactly this part (counted twice?): " + "; or ".join(extra)
    return None


def _stem_mistakes(cfg):
    """(hint, parameters the mistake leaves out) for a hybrid stem or a non-square image."""
    p, d, learned = cfg["patch_size"], cfg["dim"], cfg.get("pos_embed", "learned") == "learned"
    height, width = ref.to_pair(cfg["image_size"])
    image_n, channels, stem = (height // p) * (width // p), cfg["in_channels"], 0
    for c_out in cfg.get("stem_channels") or ():
        stem += 9 * channels * c_out + 2 * c_out
        channels, height, width = c_out, (height + 1) // 2, (width + 1) // 2
    n = (height // p) * (width // p)
    hints = [("N counts the patches of a square: N = (height / P) * (width / P)",
              (n - (height // p) ** 2) * d * learned)]
    if stem:
        hints += [("the stem's parameters are not counted: add `stem`, as the given lines compute it", stem),
                  ("after the stem the patches are cut from its output: use `channels` (the stem's last width), not "
                   "in_channels", p * p * (channels - cfg["in_channels"]) * d),
                  ("after the stem the patches are cut from its smaller map: count N from `height` and `width`, not "
                   "image_size", (n - image_n) * d * learned)]
    return hints


STEMS = [  # tried after the configurations above (their tests are not counted: the success line stays)
    dict(image_size=(28, 20), patch_size=4, in_channels=3, num_classes=10, dim=32, depth=2, num_heads=2, mlp_ratio=2.0),
    dict(image_size=32, patch_size=2, in_channels=3, num_classes=10, dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
         stem_channels=(16, 32)),
    dict(image_size=(28, 36), patch_size=2, in_channels=1, num_classes=7, dim=24, depth=1, num_heads=2, mlp_ratio=2.0,
         stem_channels=(8,)),
]


@check("count_parameters")
def count_parameters(c, fn):
    """count_parameters(**config) == the trainable parameters of ViT(**config), by formula (no model built), as an
    int."""
    for cfg in CONFIGS + OPTIONS + STEMS:
        if cfg is STEMS[0]:
            counted = c.tests
        expected = ref.count_parameters(**cfg)
        c.phase("output")
        with TorchCalls() as calls:
            raw = c.call(fn, **cfg)
        got = c.number(raw, "the count")
        c.ok(got == expected, f"counted {got:,.0f} parameters, expected {expected:,} ({expected - got:+,.0f})",
             _hint(cfg, expected, got))
        if cfg is CONFIGS[0]:
            c.phase("formula")
            c.ok(calls.count == 0, f"your count called torch {calls.count} times for ViT-B/16", "count by formula, "
                 "without building the model or any tensor: the point is to size models too big for your memory")
        c.phase("int")
        c.ok(isinstance(raw, numbers.Integral), f"the count should be an int, got {type(raw).__name__} {raw!r}",
             "use // to count the patches (or int(...)): / always gives a float")
    c.tests = counted
