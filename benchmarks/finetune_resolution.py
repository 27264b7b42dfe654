"""The ViT paper's resolution claim in miniature: the shipped ``cifar10-plain`` at 32 px, at 48 px with its position
table resampled in 2D, and after a short fine-tune at 48 px.

Upsampled images add no detail, but each 4 x 4 patch then covers less of the object (a 12 x 12 grid instead of
8 x 8), which is the mechanism the paper relies on when it fine-tunes at a higher resolution than it pre-trained
at. Test images are upsampled bicubically from the 32 x 32 originals; the fine-tune uses the course's crop and
flip on upsampled training images, AdamW at a tenth of the recipe's learning rate with a cosine to zero, for a
time budget. Writes benchmarks/results/finetune_resolution.json; chapter 09 reads it.

    python benchmarks/finetune_resolution.py                  # 10 minutes of fine-tuning
    python benchmarks/finetune_resolution.py --smoke --checkpoint PATH --out /tmp/ft.json
"""

import argparse
import functools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import RESULTS

from vit_course import DATASETS, ViT, evaluate, fit, load, load_checkpoint
from vit_course.batches import DeviceLoader, cifar_augment
from vit_course.checkpoint import pretrained_path
from vit_course.device import machine
from vit_course.files import write_json
from vit_course.patches import resample_position_embeddings

OUT = RESULTS / "finetune_resolution.json"


def upsample(images, size):
    """uint8 images (b, C, H, W) -> uint8 (b, C, size, size), bicubic (what a higher-resolution camera can't add)."""
    out = F.interpolate(images.float(), size=(size, size), mode="bicubic", align_corners=False)
    return out.round().clamp(0, 255).to(torch.uint8)


def at_resolution(model, size):
    """The same ViT for ``size`` x ``size`` images: every weight copied, the position table resampled in 2D."""
    config = dict(model.config, image_size=size)
    bigger = ViT(**config)
    state = dict(model.state_dict())
    grid = bigger.grid_size
    state["pos_embed"] = resample_position_embeddings(state["pos_embed"], grid, model.num_prefix_tokens)
    bigger.load_state_dict(state)
    return bigger.eval()


def loader(images, labels, batch, train=False, seed=0):
    meta = DATASETS["cifar10"]
    augment = functools.partial(cifar_augment, padding=4) if train else None
    return DeviceLoader(images, labels, batch, shuffle=train, drop_last=train, augment=augment, seed=seed,
                        mean=meta["mean"], std=meta["std"], device="cpu")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the shipped cifar10-plain")
    parser.add_argument("--resolution", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=600, help="time budget of the fine-tune")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--smoke", action="store_true", help="a few seconds on a sliver of the data, for the tests")
    args = parser.parse_args(argv)
    model, _ = load_checkpoint(args.checkpoint or pretrained_path("cifar10-plain"))
    base = model.image_size[0]
    images, labels = load("cifar10", "train")
    test_images, test_labels = load("cifar10", "test")
    if args.smoke:
        images, labels, test_images, test_labels = images[:256], labels[:256], test_images[:128], test_labels[:128]
        args.seconds = min(args.seconds, 5)
    accuracy = {"base": evaluate(model, loader(test_images, test_labels, 256))[1]}
    big_test = loader(upsample(test_images, args.resolution), test_labels, 256)
    bigger = at_resolution(model, args.resolution)
    accuracy["resampled"] = evaluate(bigger, big_test)[1]
    train = loader(upsample(images, args.resolution), labels, 128, train=True)
    lr = 0.1 * 2e-3
    started = time.perf_counter()
    # epochs=100: more than the budget allows, so the clock ends the fine-tune with a decayed learning rate
    fit(bigger, train, [next(iter(big_test))], epochs=100, lr=lr, weight_decay=0.05, warmup_epochs=0,
        label_smoothing=0.1, device="cpu", time_budget=args.seconds, progress=False)
    seconds = time.perf_counter() - started
    accuracy["finetuned"] = evaluate(bigger, big_test)[1]
    result = {"base_resolution": base, "resolution": args.resolution,
              "accuracy": {k: round(v, 4) for k, v in accuracy.items()}, "finetune_seconds": round(seconds, 1),
              "test_images": len(test_labels), "machine": machine()}
    write_json(args.out, result)
    print(json.dumps(result["accuracy"]), f"wrote {args.out}")


if __name__ == "__main__":
    main()
