"""vit_course: the reference solutions, checks and tools of "Vision Transformers from scratch".

Each module maps onto chapters of the course:
attention (01-02), blocks (03), patches (04, 09), vit (05), device.
"""

from . import checks as checks  # the exercise checks: checks.MultiHeadAttention(MultiHeadAttention)
from .attention import MultiHeadAttention, SelfAttention, merge_heads, scaled_dot_product_attention, split_heads
from .blocks import MLP, DropPath, EncoderBlock, LayerNorm, LayerScale
from .checkpoint import load_checkpoint, load_pretrained, save_checkpoint
from .data import DATASETS, DeviceLoader, data_root, load, loaders, normalize, random_crop_flip, random_translate
from .device import pick_device
from .interpret import (
    attention_distances,
    attention_map,
    attention_rollout,
    embedding_filters,
    mean_attention_distance,
    position_embedding_similarity,
    rollout_map,
)
from .patches import (
    PatchEmbedding,
    add_class_token_and_position,
    conv_to_linear_weight,
    grid_size,
    linear_to_conv_weight,
    patchify,
    resample_position_embeddings,
    sincos_position_embedding,
    unpatchify,
)
from .train import evaluate, fit, param_groups, train_step, warmup_cosine
from .vit import CONFIGS, ConvStem, ViT, convert_timm_state_dict, count_parameters, pool_tokens

__version__ = "0.1.0"

__all__ = [
    # train and checkpoints (chapters 06-07); recipes and the CLI live in vit_course.recipes and __main__
    "evaluate", "fit", "load_checkpoint", "load_pretrained", "param_groups", "save_checkpoint", "train_step",
    "warmup_cosine",
    # data (chapters 06-07); parsers, download tables and errors live in vit_course.data
    "DATASETS", "DeviceLoader", "data_root", "load", "loaders", "normalize", "random_crop_flip", "random_translate",
    # interpret (chapter 08); figures and explorers live in vit_course.plots and vit_course.widgets
    "attention_distances", "attention_map", "attention_rollout", "embedding_filters", "mean_attention_distance",
    "position_embedding_similarity", "rollout_map",
    "CONFIGS", "MLP", "ConvStem", "DropPath", "EncoderBlock", "LayerNorm", "LayerScale", "MultiHeadAttention",
    "PatchEmbedding", "SelfAttention", "ViT", "add_class_token_and_position", "conv_to_linear_weight",
    "convert_timm_state_dict", "count_parameters", "pool_tokens", "grid_size", "linear_to_conv_weight",
    "merge_heads", "patchify", "pick_device", "resample_position_embeddings", "scaled_dot_product_attention",
    "sincos_position_embedding", "split_heads", "unpatchify",
]
