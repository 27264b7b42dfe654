"""What the ViT learns (chapter 08): attention rollout, mean attention distance, position-embedding
similarity and the patch-embedding filters, the tools behind the paper's interpretability figures.

Shapes use b = batch, h = heads, n = tokens (k prefix/class tokens + N = gh * gw patches),
L = layers, D = width, P = patch size, C = channels.
"""

import torch
import torch.nn.functional as F
from einops import rearrange

from .patches import to_pair
from .train import eval_mode


def check_attention(attention, name="attention"):
    if isinstance(attention, (list, tuple)):
        raise TypeError(f"{name} must be one layer's weights (batch, heads, n, n), got a list of {len(attention)} "
                        f"(layer_attentions returns one per layer): pass one of them, e.g. attentions[-1]")
    if attention.ndim != 4 or attention.shape[-1] != attention.shape[-2] or attention.shape[0] == 0:
        raise ValueError(f"{name} must be (batch, heads, n, n) weights of at least one image, got shape "
                         f"{tuple(attention.shape)}")


def num_prefix(n, grid_size):
    """How many prefix (class) tokens precede the gh * gw patch tokens in a sequence of n."""
    gh, gw = to_pair(grid_size)
    if n < gh * gw:
        raise ValueError(f"{n} tokens cannot hold a {gh}x{gw} patch grid ({gh * gw} patches)")
    if n - gh * gw > 1:
        raise ValueError(f"{n} tokens do not fit a {gh}x{gw} patch grid: that leaves {n - gh * gw} class tokens, and "
                         f"a ViT has 0 or 1 (the model's grid is model.grid_size)")
    return n - gh * gw


def attention_rollout(attentions):
    """Attention rollout (Abnar & Zuidema 2020): how much each token's final state draws on each input token.

    Per layer l: Ā_l, the mean of its heads; Ã_l = Ā_l + I (the residual path, x + attn(x)) with each row
    divided by its sum; then R = Ã_L ... Ã_2 Ã_1, the last layer on the left.

    Args:
        attentions: list (one per layer, first layer first) of weights (b, h, n, n)
    Returns:
        R (b, n, n) float32 (whatever the weights' dtype), rows sum to 1: row i is the share of each input
        token in token i's output
    Raises:
        ValueError for an empty list, weights that are not (b, h, n, n), or layers of different n
    """
    if len(attentions) == 0:
        raise ValueError("attention_rollout needs at least one layer of attention weights, got an empty list")
    rollout = None
    for i, attention in enumerate(attentions):
        check_attention(attention, f"attentions[{i}]")
        if rollout is not None and attention.shape[-1] != rollout.shape[-1]:
            raise ValueError(f"attentions[{i}] has {attention.shape[-1]} tokens, earlier layers "
                             f"{rollout.shape[-1]}")
        n = attention.shape[-1]
        a = attention.float().mean(dim=1)  # (b, n, n): heads averaged
        a = a + torch.eye(n, device=a.device)  # (b, n, n): the residual connection carries the token itself
        a = a / a.sum(dim=-1, keepdim=True)  # (b, n, n): rows sum to 1 again
        rollout = a if rollout is None else a @ rollout  # (b, n, n): later layers act on what earlier ones mixed
    return rollout


def pooled_row(weights, num_prefix, pool=None):
    """(..., n, n) -> (..., N): the row the classifier head reads, over the patch tokens: the class token's row
    (pool "cls"), or the mean of the patch tokens' rows (pool "mean", which ignores a class token if there is one).
    pool None: "cls" when there is a prefix token, else "mean" (pass the model's ``pool`` when you have it)."""
    pool = ("cls" if num_prefix > 0 else "mean") if pool is None else pool
    if pool == "cls" and num_prefix < 1:
        raise ValueError('pool="cls" reads the class token\'s row, but these weights have no prefix token')
    if pool not in ("cls", "mean"):
        raise ValueError(f'pool must be "cls", "mean" or None, got {pool!r}')
    if pool == "cls":
        return weights[..., 0, num_prefix:]  # (..., N)
    return weights[..., num_prefix:, num_prefix:].mean(dim=-2)  # (..., N)


def _to_grid(maps, grid_size, image_size, normalize, mode):
    """(..., N) -> (..., gh, gw), or (..., H, W) upsampled; optionally scaled to a maximum of 1 per map."""
    gh, gw = to_pair(grid_size)
    maps = rearrange(maps, "... (gh gw) -> ... gh gw", gh=gh, gw=gw)  # (..., gh, gw)
    if image_size is not None:
        lead = maps.shape[:-2]
        flat = maps.reshape(-1, 1, gh, gw)  # (m, 1, gh, gw): interpolate wants a channel axis
        kwargs = {} if mode == "nearest" else {"align_corners": False}
        flat = F.interpolate(flat, size=to_pair(image_size), mode=mode, **kwargs)  # (m, 1, H, W)
        maps = flat.reshape(*lead, *flat.shape[-2:])  # (..., H, W)
    if normalize:
        peak = maps.flatten(-2).amax(dim=-1).clamp_min(1e-12)  # (...,): each map's largest value
        maps = maps / peak[..., None, None]  # (..., gh, gw), or (..., H, W) upsampled, in [0, 1]
    return maps


def rollout_map(attentions, grid_size, image_size=None, normalize=True, mode="nearest", pool=None):
    """The rollout of the class token over the patches, laid out on the patch grid (or the image).

    Args:
        attentions: list of per-layer weights (b, h, n, n), n = k + gh * gw
        grid_size: (gh, gw) or an int for a square grid
        image_size: (H, W) or int to upsample the map over the image; None keeps (gh, gw)
        normalize: divide each map by its maximum, for display
        mode: interpolation for the upsampling: "nearest" (default) draws each token's cell as one flat square,
            what the model sees; "bilinear" smooths the cells into blobs the model never made
        pool: the model's pooling, which says which row the head reads (``pooled_row``; None: guessed)
    Returns:
        (b, gh, gw), or (b, H, W) with image_size. For a mean-pooled model, the mean of the patch
        tokens' rollout rows (what its head reads).
    """
    rollout = attention_rollout(attentions)  # (b, n, n)
    k = num_prefix(rollout.shape[-1], grid_size)
    return _to_grid(pooled_row(rollout, k, pool), grid_size, image_size, normalize, mode)


def attention_map(attention, grid_size, image_size=None, normalize=True, mode="nearest", pool=None):
    """One layer's raw attention from the class token to the patches, per head.

    Args:
        attention: one layer's weights (b, h, n, n), n = k + gh * gw
        grid_size, image_size, normalize, mode, pool: as for ``rollout_map``
    Returns:
        (b, h, gh, gw), or (b, h, H, W) with image_size
    """
    check_attention(attention)
    k = num_prefix(attention.shape[-1], grid_size)
    return _to_grid(pooled_row(attention.float(), k, pool), grid_size, image_size, normalize, mode)


def patch_centres(grid_size, patch_size):
    """Pixel coordinates (row, column) of the patch centres, row by row: (gh * gw, 2)."""
    gh, gw = to_pair(grid_size)
    ph, pw = to_pair(patch_size)
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")  # (gh, gw) each
    return torch.stack([(ys.flatten() + 0.5) * ph, (xs.flatten() + 0.5) * pw], dim=-1).float()  # (N, 2)


def mean_attention_distance(attention, grid_size, patch_size):
    """Per head, how far in pixels a patch looks on average: the paper's "attention distance".

    For each query patch, the attention-weighted mean of the distances between its centre and
    every key patch's centre; averaged over the queries and the batch. Prefix (class) tokens are
    left out on both axes and each query's weights on the patches renormalised to sum to 1, so the
    distance says where a head looks *among the patches*, however much it also gives the class token,
    and uniform attention over the patches gives ``uniform_attention_distance`` with or without one.

    Args:
        attention: weights (b, h, n, n), n = gh * gw or k + gh * gw
        grid_size: (gh, gw) or int
        patch_size: P (or (Ph, Pw)): pixels per patch side, the unit of the distance
    Returns:
        (h,) mean distance in pixels per head
    Raises:
        ValueError when attention is not (b, h, n, n) or n cannot hold the grid
    """
    check_attention(attention)
    k = num_prefix(attention.shape[-1], grid_size)
    a = attention[:, :, k:, k:].float()  # (b, h, N, N): patches only
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)  # (b, h, N, N): each query's patch weights sum to 1
    centres = patch_centres(grid_size, patch_size).to(a.device)  # (N, 2)
    distance = torch.cdist(centres, centres)  # (N, N) pixels between patch centres
    per_query = (a * distance).sum(dim=-1)  # (b, h, N): expected distance of each query's gaze
    return per_query.mean(dim=(0, 2))  # (h,)


def uniform_attention_distance(grid_size, patch_size):
    """The mean attention distance (pixels) of a head that spreads its weight evenly over all patches:
    the reference line of the figure. Heads below it favour nearby patches, heads above it far ones."""
    gh, gw = to_pair(grid_size)
    uniform = torch.full((1, 1, gh * gw, gh * gw), 1.0 / (gh * gw))  # (1, 1, N, N)
    return mean_attention_distance(uniform, (gh, gw), patch_size).item()


@torch.no_grad()
def layer_attentions(model, images):
    """The attention weights of every block of a ``ViT``: images (b, C, H, W) -> list of L (b, h, n, n).

    The fused kernel that ``forward`` uses does not return the weights, so this runs the blocks one by one and
    asks each block's attention for its weights on the block's normalised input (eval mode, no dropout).
    """
    with eval_mode(model):
        x = model.embed(images.to(next(model.parameters()).device))  # (b, n, D), on the model's device
        weights = []
        for block in model.blocks:
            weights.append(block.attn.attention_weights(block.norm1(x)))  # (b, h, n, n)
            x = block(x)  # (b, n, D)
    return weights


@torch.no_grad()
def run_model(model, inputs, batch_size=256):
    """Logits (b, classes) and attention weights L x (b, h, n, n) of ``model`` on normalised ``inputs``, on the
    CPU. The model runs in eval mode on its own device and is left in the mode it had."""
    device = next(model.parameters()).device
    logits, attentions = [], []
    with eval_mode(model):
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start:start + batch_size].to(device)  # (b, C, H, W)
            logits.append(model(batch).float().cpu())
            attentions.append([w.float().cpu() for w in layer_attentions(model, batch)])
    return torch.cat(logits), [torch.cat(layer) for layer in zip(*attentions, strict=True)]


def pixels_per_token(model):
    """How many pixels one patch of the token grid spans: the patch size, times a hybrid stem's reduction."""
    return model.patch_embed.patch_size * getattr(model.stem, "reduction", 1)


def attention_distances(model, images, batch_size=256):
    """Mean attention distance of every head in every layer of ``model`` over ``images``.

    The pixel unit is ``pixels_per_token(model)``: the patch size, times the conv stem's reduction for a
    hybrid model (one patch of its feature map covers ``reduction * P`` pixels).

    Args:
        model: a ``ViT``; it is run in eval mode on its own device
        images: (b, C, H, W), already normalised as the model expects
        batch_size: images per forward pass (the weights of all layers are kept per pass)
    Returns:
        (L, h) tensor on the CPU
    """
    if images.ndim != 4 or len(images) == 0:
        raise ValueError(f"images must be a non-empty batch (b, C, H, W), got shape {tuple(images.shape)}")
    device, total = next(model.parameters()).device, 0.0
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size].to(device)
        per_layer = torch.stack([mean_attention_distance(a, model.grid_size, pixels_per_token(model))
                                 for a in layer_attentions(model, batch)])  # (L, h)
        total = total + per_layer.cpu() * len(batch)  # weighted so batches average exactly
    return total / len(images)  # (L, h)
