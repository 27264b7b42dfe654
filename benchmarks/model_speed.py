"""Training-step speed of vit_course.ViT against timm's VisionTransformer and an nn.TransformerEncoder model.

Same configuration for all three (CIFAR-sized: 32x32, patch 4, D 128, 6 layers, 4 heads, MLP ratio 2, batch 128),
timed alternately in one process so machine noise hits them alike. Prints per-model median step times over
rounds and the ratios.

    python benchmarks/model_speed.py [--rounds 5] [--steps 10] [--threads N]
"""

import argparse
import statistics
import time

import common  # noqa: F401 (this checkout's vit_course and tests)
import torch
from torch import nn

from tests.timm_shim import import_timm
from vit_course import ViT

CONFIG = dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=128, depth=6, num_heads=4, mlp_ratio=2.0)


class TorchEncoderViT(nn.Module):
    """The same ViT built from nn.TransformerEncoderLayer (PyTorch's own fused block)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        n = (image_size // patch_size) ** 2 + 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, num_heads, int(dim * mlp_ratio), dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True, layer_norm_eps=1e-6)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (b, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def models():
    out = {"vit_course.ViT": ViT(**CONFIG)}
    timm = import_timm()
    if timm is not None:
        from timm.models.vision_transformer import VisionTransformer

        out["timm VisionTransformer"] = VisionTransformer(
            img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0)
    out["nn.TransformerEncoder ViT"] = TorchEncoderViT(**CONFIG)
    return out


def step_time(model, optimizer, x, y, steps):
    start = time.perf_counter()
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
    runs = {name: (m.train(), torch.optim.AdamW(m.parameters(), lr=1e-3)) for name, m in models().items()}
    for model, opt in runs.values():
        step_time(model, opt, x, y, 3)  # warm up
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, opt) in runs.items():  # alternate so noise hits every model alike
            times[name].append(step_time(model, opt, x, y, args.steps))
    base = statistics.median(times["vit_course.ViT"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} steps")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} median {med * 1000:7.1f} ms/step  (min {min(ts) * 1000:.1f}, max {max(ts) * 1000:.1f})"
              f"  ratio to ViT {med / base:.3f}")


if __name__ == "__main__":
    main()
