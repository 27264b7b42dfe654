"""One check per exercise of every chapter, named after it: ``checks.MultiHeadAttention(MultiHeadAttention)``.

A passing check prints one line (``✔ name: passed N tests``) and returns None; a failing one raises
``CheckFailed`` (an ``AssertionError``) saying what was tried, what was expected and the likely cause.
Checks compare against the reference solutions in ``vit_course`` and never depend the other way round.

Modules, by chapter: ``attention`` (01), ``heads`` and ``multihead`` (02), ``blocks`` and ``encoder`` (03),
``patches`` (04), ``vit`` and ``counting`` (05), ``training`` and ``schedule`` (06), ``augment`` and
``pooling`` (07), ``interpret`` and ``faithfulness`` (08), ``resample`` (09); ``core``, ``messages``,
``modules`` and ``common`` hold what they share, ``gradients`` the test that gradients flow through the learner's
code, and ``rules`` each exercise's list of rules, shared by its statement and its check.
"""

from .attention import SelfAttention, scaled_dot_product_attention
from .augment import random_crop_flip
from .blocks import MLP, DropPath, LayerNorm
from .core import CheckFailed
from .counting import count_parameters
from .encoder import EncoderBlock
from .faithfulness import delete_patches
from .heads import merge_heads, split_heads
from .interpret import attention_rollout, mean_attention_distance, position_embedding_similarity
from .multihead import MultiHeadAttention
from .patches import PatchEmbedding, add_class_token_and_position, patchify, unpatchify
from .pooling import pool_tokens
from .resample import resample_position_embeddings
from .schedule import warmup_cosine
from .training import evaluate, train_step
from .vit import ViT

__all__ = [
    "MLP", "CheckFailed", "DropPath", "EncoderBlock", "LayerNorm", "MultiHeadAttention", "PatchEmbedding",
    "SelfAttention", "ViT", "add_class_token_and_position", "count_parameters", "merge_heads", "patchify",
    "resample_position_embeddings", "scaled_dot_product_attention", "split_heads", "unpatchify", "train_step",
    "evaluate", "warmup_cosine", "random_crop_flip", "attention_rollout", "mean_attention_distance",
    "position_embedding_similarity", "pool_tokens", "delete_patches",
]
