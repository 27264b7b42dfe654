"""Training-step time of a recipe's model with two conv stems, alternated in one process: what a stem stage saves.

The model is the recipe's with only ``stem_channels`` changed, trained one step at a time on a fixed random batch of
the recipe's batch size (``common.training_step``), the two stems alternated round by round
(``common.alternated``) so a change in the machine's speed hits both alike. With --record the comparison
is appended to benchmarks/results/stem_speed.json with the machine and its load.

    python benchmarks/stem_speed.py mnist "(32, 64)" "(16, 32, 64)" --record
"""

import argparse
import ast
import os
from pathlib import Path

import torch
from common import RESULTS, alternated, training_step
from machine import machine

from vit_course.files import append_run
from vit_course.recipes import RECIPES


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(RECIPES))
    parser.add_argument("stems", nargs=2, metavar="STEM", help='two stems as Python tuples, e.g. "(32, 64)"')
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--record", action="store_true", help="append to RESULTS/stem_speed.json")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    stems = [tuple(ast.literal_eval(text)) for text in args.stems]
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    steps = {label: training_step(args.name, changes={"stem_channels": stem})
             for label, stem in zip(("first", "second"), stems, strict=True)}
    result = {"recipe": args.name, "stems": [list(stem) for stem in stems], "rounds": args.rounds,
              "batch_size": RECIPES[args.name]["train"]["batch_size"], **alternated(steps, args.rounds),
              "threads": args.threads, "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
              "machine": machine()}
    print(f"{args.name}: stem {stems[0]} {result['first_ms']:.1f} ms, stem {stems[1]} {result['second_ms']:.1f} ms "
          f"per step (batch {result['batch_size']}, {args.threads} threads): the second {result['speedup']:.2f}x as "
          f"fast (rounds {result['speedup_range'][0]:.2f}-{result['speedup_range'][1]:.2f}x)")
    if args.record:
        append_run(args.results / "stem_speed.json", result, command="python benchmarks/stem_speed.py NAME A B")
    return result


if __name__ == "__main__":
    main()
