"""vit_course: the reference solutions, checks and tools of "Vision Transformers from scratch".

One module per idea, in the order the chapters meet them:
attention (01-02) · blocks (03) · patches (04, 09) · vit (05) · hybrid (06-07: the conv stem) · baselines (07:
the small CNN) · data, download, batches (06-07: files -> tensors -> batches) · train (06: step, evaluation,
schedule) · loop (06-07: ``fit``, its settings, mixed precision, time budget) · checkpoint · recipes (the
``train`` command) · device (where to compute, threads) · interpret, embeddings, faithfulness (08) · plots, widgets
(figures and explorers) · checks (every exercise's check) · notebooks, grade, kernel (student notebooks, grading
them) · results (the README's and the book's results tables) · files (atomic writes).
"""

# ruff: noqa: E402 (the clock starts before the imports below)
import time

IMPORTED_AT = time.perf_counter()  # `python -m vit_course train` counts its budget from here, torch's import included

from . import checks as checks  # the exercise checks: checks.MultiHeadAttention(MultiHeadAttention)
from .attention import MultiHeadAttention, SelfAttention, merge_heads, scaled_dot_product_attention, split_heads
from .batches import DeviceLoader, loaders, normalize, random_crop_flip, random_translate
from .blocks import MLP, DropPath, EncoderBlock, LayerNorm, LayerScale
from .checkpoint import load_checkpoint, load_pretrained, save_checkpoint
from .data import DATASETS, data_root, load
from .device import pick_device, pick_threads
from .embeddings import embedding_filters, position_embedding_similarity
from .faithfulness import delete_patches
from .hybrid import ConvStem
from .interpret import (
    attention_distances,
    attention_map,
    attention_rollout,
    layer_attentions,
    mean_attention_distance,
    rollout_map,
)
from .loop import fit
from .patches import (
    PatchEmbedding,
    add_class_token_and_position,
    conv_to_linear_weight,
    linear_to_conv_weight,
    patch_grid,
    patchify,
    resample_position_embeddings,
    sincos_position_embedding,
    unpatchify,
)
from .train import eval_mode, evaluate, param_groups, train_step, warmup_cosine
from .vit import CONFIGS, ViT, convert_timm_state_dict, count_parameters, pool_tokens

__version__ = "0.1.0"

__all__ = [
    # 01-05: the model
    "CONFIGS", "MLP", "ConvStem", "DropPath", "EncoderBlock", "LayerNorm", "LayerScale", "MultiHeadAttention",
    "PatchEmbedding", "SelfAttention", "ViT", "add_class_token_and_position", "conv_to_linear_weight",
    "convert_timm_state_dict", "count_parameters", "linear_to_conv_weight", "merge_heads", "patch_grid",
    "patchify", "pool_tokens", "resample_position_embeddings", "scaled_dot_product_attention",
    "sincos_position_embedding", "split_heads", "unpatchify",
    # 06-07: data and training; recipes and the CLI live in vit_course.recipes and __main__
    "DATASETS", "DeviceLoader", "data_root", "eval_mode", "evaluate", "fit", "load", "load_checkpoint",
    "load_pretrained", "loaders", "normalize", "param_groups", "pick_device", "pick_threads", "random_crop_flip",
    "random_translate", "save_checkpoint", "train_step", "warmup_cosine",
    # 08: interpretation; figures and explorers live in vit_course.plots and vit_course.widgets
    "attention_distances", "attention_map", "attention_rollout", "delete_patches", "embedding_filters",
    "layer_attentions", "mean_attention_distance", "position_embedding_similarity", "rollout_map",
]
