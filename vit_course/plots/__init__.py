"""Figures (chapters 04, 06-08). Every function returns the matplotlib Figure and never calls ``plt.show()``
(notebooks end the cell with it).

images: pixels, overlays and the patch grid (04) · training: curves (06-07) · learned: what the ViT learns (08).
"""

from .images import OVERLAY, plot_patch_grid, plot_patch_sizes, show_image, show_overlay, to_pixels
from .learned import (
    plot_attention_distance,
    plot_attention_maps,
    plot_deletion,
    plot_embedding_filters,
    plot_position_similarity,
    plot_rollout_grid,
)
from .training import plot_curves, plot_data_scaling

__all__ = ["OVERLAY", "plot_attention_distance", "plot_attention_maps", "plot_curves", "plot_data_scaling",
           "plot_deletion", "plot_embedding_filters", "plot_patch_grid", "plot_patch_sizes", "plot_position_similarity",
           "plot_rollout_grid", "show_image", "show_overlay", "to_pixels"]
