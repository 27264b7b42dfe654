"""One check per exercise of every chapter, named after it: ``checks.MultiHeadAttention(MultiHeadAttention)``.

A passing check prints one line (``✔ name: passed``, the same however many tests it ran) and returns None; a failing one raises
``CheckFailed`` (an ``AssertionError``) saying what was tried, what was expected and the likely cause.
Checks compare against the reference solutions in ``vit_course`` and never depend the other way round.

The checks mirror the reference: the check of an exercise whose solution is in ``vit_course/X.py`` is in
``checks/X.py``, or in ``checks/X_<part>.py`` where X's checks would not fit one module (and its tests in
``tests/test_checks_X*.py``); each imports its reference module at the top, ``from .. import X as ref``.
attention (01: scaled_dot_product_attention, SelfAttention), attention_heads (02: split_heads, merge_heads,
MultiHeadAttention), blocks (03: MLP, LayerNorm, DropPath), blocks_encoder (03: EncoderBlock), patches (04),
patches_resample (09), vit (05: ViT; 07: pool_tokens), vit_counting (05: count_parameters), train (06), batches
(07: random_crop_flip), interpret, embeddings and faithfulness (08).

What they share: ``core`` (``CheckFailed``, ``@check``, the ``Checker`` that runs learner code safely and compares
outputs), ``messages`` (how values and errors are shown), ``modules`` (building, loading and probing nn.Module
exercises), ``probes`` (the torch functions learner code calls, float16 calls, why it raised), ``slips`` (the usual
attention slips and their hints), ``gradients`` (gradients flow through the learner's code) and ``rules`` (each
exercise's list of rules, shared by its statement and its check).
"""

from .attention import SelfAttention, scaled_dot_product_attention
from .attention_heads import MultiHeadAttention, merge_heads, split_heads
from .batches import random_crop_flip
from .blocks import MLP, DropPath, LayerNorm
from .blocks_encoder import EncoderBlock
from .core import CheckFailed
from .embeddings import position_embedding_similarity
from .faithfulness import delete_patches
from .interpret import attention_rollout, mean_attention_distance
from .patches import PatchEmbedding, add_class_token_and_position, patchify, unpatchify
from .patches_resample import resample_position_embeddings
from .train import evaluate, train_step, warmup_cosine
from .vit import ViT, pool_tokens
from .vit_counting import count_parameters

__all__ = [
    "MLP", "CheckFailed", "DropPath", "EncoderBlock", "LayerNorm", "MultiHeadAttention", "PatchEmbedding",
    "SelfAttention", "ViT", "add_class_token_and_position", "count_parameters", "merge_heads", "patchify",
    "resample_position_embeddings", "scaled_dot_product_attention", "split_heads", "unpatchify", "train_step",
    "evaluate", "warmup_cosine", "random_crop_flip", "attention_rollout", "mean_attention_distance",
    "position_embedding_similarity", "pool_tokens", "delete_patches",
]
