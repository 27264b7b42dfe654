"""One check per exercise, named after it: ``checks.MultiHeadAttention(MultiHeadAttention)``.

A passing check prints one line (``✔ name: passed N tests``) and returns None; a failing one raises
``CheckFailed`` (an ``AssertionError``) saying what was tried, what was expected and the likely cause.
Checks compare against the reference solutions in ``vit_course`` and never depend the other way round.
"""

from .attention import MultiHeadAttention, SelfAttention, merge_heads, scaled_dot_product_attention, split_heads
from .augment import random_crop_flip
from .blocks import MLP, DropPath, EncoderBlock, LayerNorm
from .core import CheckFailed
from .interpret import attention_rollout, mean_attention_distance, position_embedding_similarity
from .patches import PatchEmbedding, add_class_token_and_position, patchify, resample_position_embeddings, unpatchify
from .training import evaluate, train_step, warmup_cosine
from .vit import ViT, count_parameters, pool_tokens

__all__ = [
    "MLP", "CheckFailed", "DropPath", "EncoderBlock", "LayerNorm", "MultiHeadAttention", "PatchEmbedding",
    "SelfAttention", "ViT", "add_class_token_and_position", "count_parameters", "merge_heads", "patchify",
    "resample_position_embeddings", "scaled_dot_product_attention", "split_heads", "unpatchify", "train_step",
    "evaluate", "warmup_cosine", "random_crop_flip", "attention_rollout", "mean_attention_distance",
    "position_embedding_similarity", "pool_tokens",
]
