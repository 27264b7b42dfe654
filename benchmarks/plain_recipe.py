"""How the ``cifar10-plain`` recipe was chosen: short runs of candidate settings at one time budget.

Each candidate is ``benchmarks/ablate.py cifar10-plain --budget SECONDS --set ...`` in a fresh process, one
after another (never two at once: they share the cores). The schedule follows the clock, so every candidate
ends its short run with a decayed learning rate. Results are appended to benchmarks/results/plain_recipe.json.
Short runs favour small, fast models; the chapter and the recipe's comment say how far they can be trusted.

    python benchmarks/plain_recipe.py --budget 390
    python benchmarks/plain_recipe.py --budget 390 --only width-192
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "plain_recipe.json"
CANDIDATES = {  # name -> --set arguments on top of the recipe
    "recipe": [],
    "width-192": ["model.dim=192", "model.num_heads=3"],
    "heads-8": ["model.num_heads=8"],
    "lr-1e-3": ["train.lr=1e-3"],
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=390, help="seconds for each whole run")
    parser.add_argument("--only", action="append", choices=sorted(CANDIDATES), help="run only these")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    for name in args.only or CANDIDATES:
        command = [sys.executable, str(HERE / "ablate.py"), "cifar10-plain", "--budget", str(args.budget),
                   "--seed", str(args.seed), "--out", f"runs/plain_recipe/{name}"]
        for setting in CANDIDATES[name]:
            command += ["--set", setting]
        line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        result = {"candidate": name, "budget": args.budget, **json.loads(line)}
        print(json.dumps(result), flush=True)
        results.append(result)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
