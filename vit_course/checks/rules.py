"""Each exercise's rules (chapters 01-07): the one list that the statement and the check share.

``RULES[exercise]`` maps each rule the check tests (the keys a check passes to ``Checker.phase``, which a
failure carries as ``CheckFailed.rule``) to the words that state it in the exercise's statement (its markdown or
the docstring of its stub); ``COURSE_RULES`` are the rules every check applies, stated once, where chapter 01
says how the checks work. The checks' own tests hold the list to both sides: each rule is found in its
statement, a check tests exactly its exercise's rules, and each rule has a wrong variant the check rejects.
"""

COURSE_RULES = {
    "inputs": "leaves its inputs unchanged",
}

RULES = {
    # chapter 01
    "scaled_dot_product_attention": {
        "output": "returning `(out, weights)`",
        "plain": "Use plain tensor operations (`@`, `.transpose`, `.softmax`, `.masked_fill`), not PyTorch's fused "
                 "function",
        "mask": "True = may attend",
        "gradient": "gradients flow back to `q`, `k` and `v`",
    },
    "SelfAttention": {
        "names": "three bias-free linear layers named `q`, `k` and `v`",
        "output": "returns the output `(b, m, head_dim)`",
        "mask": "passing `mask` on to the attention",
        "attention_weights": "`attention_weights(x, mask=None)` returns the weights `(b, m, m)`",
        "gradient": "gradients flow back to `x` and to the weights of `q`, `k` and `v`",
    },
    # chapter 02
    "split_heads": {
        "output": "head $i$ owning the $i$-th contiguous block of $d$ features",
        "error": "Raise a `ValueError` naming both numbers",
        "gradient": "Gradients flow back to `x`",
    },
    "merge_heads": {
        "output": "`(b, h, n, d)` becomes `(b, n, h*d)`",
        "gradient": "Gradients flow back to `x`",
    },
    "MultiHeadAttention": {
        "attributes": "store `dim`, `num_heads` and `head_dim = dim // num_heads`",
        "names": "create `qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)`",
        "split_qkv": "split the `qkv` output into queries, keys and values of shape `(b, h, n, d)` each",
        "output": "Then merge the heads and apply `proj` and `proj_drop`. Returns `(b, n, dim)`",
        "mask": "attn_mask=mask",
        "attention_weights": "`attention_weights(x, mask=None)`: the weights `(b, h, n, n)`",
        "dropout": "only in training mode",
        "error-dim": "raise a `ValueError` if `dim` is not divisible by `num_heads`",
        "error-shape": "raise a `ValueError` naming the shape otherwise",
        "gradient": "Gradients flow back to `x`, `qkv` and `proj`",
    },
    # chapter 03
    "MLP": {
        "names": "`fc1 = nn.Linear(dim, hidden_dim)`",
        "output": "fc1, GELU, dropout, fc2, dropout",
        "dropout": "`drop1 = nn.Dropout(drop)`",
        "gradient": "gradients flow back to `x`, `fc1` and `fc2`",
    },
    "LayerNorm": {
        "names": "parameters `weight` (ones, shape `(dim,)`) and `bias` (zeros)",
        "parameters": "parameters `weight` (ones, shape `(dim,)`) and `bias` (zeros)",
        "output": "as in the formula above",
        "eps": "`LayerNorm(dim, eps=1e-6)`",
        "gradient": "gradients flow back to `x`, `weight` and `bias`",
    },
    "DropPath": {
        "eval": "In eval mode, or with $p = 0$, return `x` unchanged",
        "training": "in training mode multiply each sample by its own 0-or-1 mask and divide by $1 - p$",
        "error": "raise a `ValueError` unless $0 \\le p < 1$",
        "p": "keep the probability as `self.p`",
        "gradient": "Gradients flow back to `x`",
    },
    "EncoderBlock": {
        "names": "with timm's names",
        "output": "apply the two pre-norm residual updates of section 1",
        "mask": "passing `mask` to the attention",
        "options": "`ls1`, a `LayerScale(dim, init_values)` if `init_values` else `nn.Identity()`",
        "drop_path": "`drop_path1`, a `DropPath(drop_path)` if `drop_path > 0` else `nn.Identity()`",
        "eps": "`norm1 = nn.LayerNorm(dim, eps=1e-6)`",
        "dropout": "`attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, "
                   "proj_drop=drop)`",
        "gradient": "Gradients flow back to `x` and every parameter",
    },
    # chapter 04
    "patchify": {
        "output": "patches row by row from the top-left, each flattened in `(p1 p2 c)` order",
        "error-ndim": "raise `ValueError` when `images` is not 4-dimensional",
        "error-sides": "when $H$ or $W$ is not divisible by $P$",
        "gradient": "**Gradients** flow back to `images`",
    },
    "unpatchify": {
        "output": "`unpatchify(patchify(x, P), P, x.shape[-2:])` equal to `x`",
        "image-size": "either an int $H$ (square images) or a pair $(H, W)$",
        "error-sides": "`ValueError` when the sides aren't divisible by $P$",
        "error-ndim": "not 3-dimensional",
        "error-length": "its length is not $(H/P)(W/P)$",
        "error-width": "its width is not a multiple of $P^2$",
        "gradient": "**Gradients** flow back to `patches`",
    },
    "PatchEmbedding": {
        "attributes": "stores `image_size` as a pair (use `to_pair`), `patch_size` (one int $P$) and `in_channels`, "
                      "the grid `grid_size` (rows, columns) and `num_patches` $N$",
        "names": "creates `proj = nn.Linear(P*P*in_channels, dim)`",
        "output": "returns tokens $(b, N, D)$",
        "error-init": "It raises `ValueError` when $P$ does not divide both sides",
        "error-shape": "raises `ValueError` when the images don't have the shape the module was built for",
        "gradient": "Gradients flow back to the images and to `proj`",
    },
    "add_class_token_and_position": {
        "output": "the class token in front of every sequence, then the position embeddings added",
        "no-class-token": "or `None` for a model without one",
        "error": "`ValueError` when `pos_embed` doesn't fit the token sequence (too few rows, too many, or one row "
                 "that would broadcast), naming both shapes",
        "gradient": "**Gradients** flow back to `tokens`, `cls_token` and `pos_embed`",
    },
    # chapter 05
    "ViT": {
        "names": "with exactly these names",
        "attributes": "| `grid_size` | the patch grid, from `patch_embed` |",
        "embed": "**`embed(images)`**",
        "output": "**`forward(images)`**: `embed`, the blocks, the final norm, pooling (`pool_tokens`), the head",
        "initial": "a zero-initialised `nn.Parameter`",
        "sincos": "a buffer (not learned) holding `sincos_position_embedding(grid_size, dim)`",
        "pool": "pooling (`pool_tokens`)",
        "drop_path": "`drop_path * i / max(depth - 1, 1)`",
        "eps": "`nn.LayerNorm(dim, eps=1e-6)`",
        "blocks": "`EncoderBlock(dim, num_heads, mlp_ratio, qkv_bias, drop, attn_drop, rate, init_values)`",
        "gradient": "Gradients flow from the logits back to every parameter",
    },
    "count_parameters": {
        "output": "returns the number of trainable parameters of `ViT(**config)` **by formula**",
        "formula": "**by formula**, without building the model",
        "int": "**Output:** an `int`",
    },
    # chapter 06
    "train_step": {
        "train-mode": "put the model in training mode",
        "loss": "the loss of this batch as a Python `float`",
        "float32": "(on float32 logits)",
        "step": "clear the old gradients; backpropagate; step the optimizer",
    },
    "evaluate": {
        "output": "`(mean_loss, accuracy)`: the cross-entropy averaged over all samples",
        "batches": "`batches`, any iterable of `(x, y)` pairs",
        "eval-mode": "Run without gradients and in eval mode",
        "no-grad": "Run without gradients",
        "restore": "leave the model in the mode it came in",
        "error": "If there were no batches at all, raise a `ValueError`",
    },
    "warmup_cosine": {
        "output": "the formula above",
    },
    # chapter 07
    "random_crop_flip": {
        "output": "Sample $i$ is the $H \\times W$ window of its zero-padded image",
        "offsets": "both uniform in $0..2p$ and drawn independently per sample",
        "flip": "mirrored left-right with probability $1/2$ (one coin per sample)",
        "loop": "No Python loop",
        "generator": "Draw the random numbers with the helper",
        "error": "raise `ValueError` for images that are not 4-D or a negative padding",
    },
    "pool_tokens": {
        "output": "for `\"cls\"` the class token's state, token 0; for `\"mean\"` the average of the patch tokens",
        "error": "Raise `ValueError` for `pool=\"cls\"` without a class token, and for any other `pool`",
        "gradient": "Gradients flow back to `x`",
    },
}
