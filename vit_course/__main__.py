"""The command line (chapters 06-08 train with it; every chapter grades with it): ``python -m vit_course train
RECIPE`` and ``python -m vit_course grade NOTEBOOK``. The maintainers' tools (student notebooks, the README's
tables) are ``python -m tools.notebooks`` and ``python -m tools.results`` in the repository."""

import argparse
import sys
import time

from . import IMPORTED_AT

ROLES = {  # what each recipe is for, in `train --help`
    "mnist": "chapter 06", "cifar10": "chapter 07", "cifar10-plain": "chapter 08's model",
    "cifar10-plain-basic": "chapter 08's contrast", "cifar10-gpu": "chapter 07 on a GPU",
    "cifar10-fast": "one GPU, about 10 minutes on an H100",
    "cifar10-plain-mixup": "chapter 08's control: Mixup instead of CutMix",
}


def at_least(kind, low):
    """An argparse type: a number of ``kind`` no lower than ``low``, or argparse's one-line error naming it."""
    def parse(text):
        value = kind(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its message for a value that is not a number
    return parse


def build_parser():
    from .recipes import RECIPES

    parser = argparse.ArgumentParser(prog="python -m vit_course", description="Vision Transformers from scratch")
    commands = parser.add_subparsers(dest="command", required=True)
    lengths = [f"  {name}: " + (f"on a CPU {r['time_budget']:.0f} s, as many epochs as fit; on a GPU (CUDA, MPS) "
                                f"{r['gpu_epochs']} epochs" if r["time_budget"] else f"{r['train']['epochs']} epochs")
               + (f" ({ROLES[name]})" if name in ROLES else "") for name, r in RECIPES.items()]
    train = commands.add_parser("train", help="train a ViT with a recipe (mnist, cifar10: the chapters' CPU ones)",
                                description="Train a ViT with a recipe (vit_course/recipes.py) and write "
                                            "OUT/model.pt, OUT/metrics.json and OUT/curves.png.",
                                epilog="How long each recipe trains (the paper-style ones take hours on a CPU); the "
                                       "first line of a run says its plan:\n"
                                       + "\n".join(lengths), formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("recipe", choices=list(RECIPES), help="the recipe (vit_course/recipes.py)")
    train.add_argument("--epochs", type=at_least(int, 1), help="train N epochs on any device, with no time budget "
                                                         "unless --time-budget is given too (default: the plan below)")
    train.add_argument("--out", help="output folder (default: runs/RECIPE)")
    train.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best one here)")
    train.add_argument("--seed", type=int, default=0, help="seed of the weights, order and augmentation")
    train.add_argument("--time-budget", type=at_least(float, 0),
                       help="seconds for the whole command (default: the recipe's on a CPU; 0 = none)")
    train.add_argument("--threads", type=at_least(int, 1),
                       help="CPU threads (default: one per core, 1 when the machine is busy)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in OUT/checkpoint.pt (same recipe and settings) after its last epoch")
    train.add_argument("--subset", type=at_least(int, 1), help=argparse.SUPPRESS)  # tests: train/test on N images
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    commands.add_parser("grade", help="run a notebook and say which exercises pass (see `grade --help`)",
                        add_help=False)
    return parser


def main(argv=None):
    argv_was_none = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "grade":  # its own parser owns the remaining arguments
        from .grade import main as grade_main

        return grade_main(argv[1:])
    args = build_parser().parse_args(argv)
    from .recipes import train_recipe

    budget = args.time_budget
    # the command's clock starts when the package was imported, torch's import included; main([...]) in a test: now
    started = IMPORTED_AT if argv_was_none else time.perf_counter()
    metrics = train_recipe(args.recipe, epochs=args.epochs, out=args.out, device=args.device, seed=args.seed,
                           time_budget=budget, subset=args.subset, progress=not args.no_progress, started=started,
                           threads=args.threads, resume=args.resume)
    print(f"{args.recipe}: test accuracy {metrics['test_accuracy']:.2%} after {metrics['epochs']:.2f} epochs, "
          f"{metrics['train_seconds']:.0f} s training, {metrics['wall_seconds']:.0f} s in all; "
          f"wrote {args.out or 'runs/' + args.recipe}/{{model.pt,metrics.json,curves.png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
