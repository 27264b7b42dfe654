"""One check per exercise of every chapter, named after it: ``checks.MultiHeadAttention(MultiHeadAttention)``.

A passing check prints one line, ``✔ name: passed`` (the same however many tests it ran), and returns None; a failing
one raises ``CheckFailed`` (an ``AssertionError``) saying what was tried, what was expected and the likely cause.
Checks compare against the reference solutions in ``vit_course`` and never depend the other way round.

One record per chapter, named after its notebook: ``chNN_<notebook>.py`` holds the chapter's checks, each
exercise's rules (``RULES``), its catalogue of slips (``SLIPS``: each wrong implementation once, with its rule and the
hint it earns) and of accepted variants (``VARIANTS``): the check names a learner's mistake from the catalogue (the
failure carries the Slip, ``CheckFailed.slip``), and the tests iterate the same catalogue.
Chapter 08's three records are named after its three exercises' sections (attention maps, position embeddings,
deletion).

What they share: ``core`` (``CheckFailed``, ``@check``, the ``Checker`` that runs learner code safely, compares
outputs and builds and loads nn.Module exercises; ``Slip``, ``COURSE_RULES``), ``messages`` (how values and errors
are shown), ``modules`` (randomised norms, the dropout probe, the ``attention_weights`` test), ``probes`` (the torch
functions learner code calls, float16 calls, why it raised), ``gradients`` (gradients flow through the learner's
code) and ``wiring`` (dropout's wiring).
"""

from . import (
    ch01_self_attention,
    ch02_multi_head_attention,
    ch03_encoder_block,
    ch04_patch_embeddings,
    ch05_vision_transformer,
    ch06_train_mnist,
    ch07_train_cifar10,
    ch08_attention_maps,
    ch08_deletion,
    ch08_position_embeddings,
    ch09_going_further,
)
from .ch01_self_attention import SelfAttention, scaled_dot_product_attention
from .ch02_multi_head_attention import MultiHeadAttention, split_heads, split_is_correct
from .ch03_encoder_block import MLP, DropPath, EncoderBlock, LayerNorm
from .ch04_patch_embeddings import (
    PatchEmbedding,
    add_class_token_and_position,
    linear_to_conv_weight,
    patchify,
    sincos_position_embedding,
)
from .ch05_vision_transformer import MinimalViT, count_parameters
from .ch06_train_mnist import evaluate, train_step, warmup_cosine
from .ch07_train_cifar10 import pool_tokens, random_crop_flip
from .ch08_attention_maps import attention_rollout, mean_attention_distance
from .ch08_deletion import delete_patches
from .ch08_position_embeddings import position_embedding_similarity
from .ch09_going_further import blockwise_attention, resample_position_embeddings
from .core import COURSE_RULES as COURSE_RULES
from .core import CheckFailed

RECORDS = (ch01_self_attention, ch02_multi_head_attention, ch03_encoder_block, ch04_patch_embeddings,
           ch05_vision_transformer, ch06_train_mnist, ch07_train_cifar10, ch08_attention_maps,
           ch08_position_embeddings, ch08_deletion, ch09_going_further)
RULES = {name: rules for record in RECORDS for name, rules in getattr(record, "RULES", {}).items()}
SLIPS = [slip for record in RECORDS for slip in getattr(record, "SLIPS", ())]
VARIANTS = [variant for record in RECORDS for variant in getattr(record, "VARIANTS", ())]

__all__ = [
    "MLP", "CheckFailed", "DropPath", "EncoderBlock", "LayerNorm", "MinimalViT", "MultiHeadAttention",
    "PatchEmbedding", "SelfAttention", "add_class_token_and_position", "count_parameters", "patchify",
    "resample_position_embeddings", "scaled_dot_product_attention", "split_heads", "split_is_correct",
    "linear_to_conv_weight", "sincos_position_embedding", "train_step",
    "evaluate", "warmup_cosine", "random_crop_flip", "attention_rollout", "mean_attention_distance",
    "position_embedding_similarity", "pool_tokens", "delete_patches", "blockwise_attention",
]
