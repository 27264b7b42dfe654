"""Training figures (chapters 06-07): the loss, accuracy and learning-rate curves of a run, and accuracy against
the size of the training set."""

from statistics import mean

import matplotlib.pyplot as plt

from ..files import atomic_write
from ..results import per_seed


def plot_curves(history, path=None, title=""):
    """Loss, accuracy and learning rate per epoch (chapters 06-07); saved atomically as a PNG at ``path``.

    The curves are the validation split's (``fit``); a run from before the course held one out evaluated on the
    test set every epoch, and its curves say "test"."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), layout="constrained")
    split = "val" if "val_acc" in history else "test"  # the shipped runs trained before validation splits: test
    name = {"val": "validation", "test": "test"}[split]
    epochs = history["epoch"]
    measured = [i for i, a in enumerate(history[f"{split}_acc"]) if a is not None]  # a resumed older run: none before
    axes[0].plot(epochs, history["train_loss"], "o-", label="train (label-smoothed)")
    axes[0].plot([epochs[i] for i in measured], [history[f"{split}_loss"][i] for i in measured], "o-", label=name)
    axes[0].legend()
    axes[1].plot([epochs[i] for i in measured], [100 * history[f"{split}_acc"][i] for i in measured], "o-", color="C1")
    axes[2].plot(epochs, history["lr"], "o-", color="C2")
    for ax, ylabel, label in zip(axes, ("cross-entropy", "%", "learning rate"),
                                 ("loss", f"{name} accuracy", "learning rate (end of epoch)"), strict=True):
        ax.set(xlabel="epoch", ylabel=ylabel, title=label)
    fig.suptitle(title)
    if path is not None:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
        plt.close(fig)
    return fig


def plot_data_scaling(result, baseline="vit", title="test accuracy against training-set size"):
    """Chapter 07: the ViT paper's data experiment in miniature, from ``benchmarks/data_scaling.py``'s JSON.

    result: {"runs": [{"model", "seed", "images", "test_accuracy", "params"}, ...]}. Left: test accuracy (%)
    against the training images (log axis), one line per model through the mean of its seeds, each seed a dot.
    Right: each other model's lead over ``baseline`` in points, the mean of the seeds (paired by seed), the bar
    from the smallest to the largest seed's lead.
    """
    table = per_seed(result["runs"])
    params = {run["model"]: run["params"] for run in result["runs"]}
    fig, (ax, gap_ax) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for i, (name, sizes) in enumerate(table.items()):
        ax.plot(list(sizes), [100 * mean(seeds.values()) for seeds in sizes.values()], "-", color=f"C{i}",
                label=f"{name} ({params[name]:,} parameters)")
        for size, seeds in sizes.items():  # every seed's run
            ax.plot([size] * len(seeds), [100 * a for a in seeds.values()], "o", color=f"C{i}", ms=4)
        if name == baseline:
            continue
        leads = [[100 * (seeds[s] - table[baseline][size][s]) for s in seeds] for size, seeds in sizes.items()]
        middle = [mean(lead) for lead in leads]
        below = [m - min(lead) for m, lead in zip(middle, leads, strict=True)]  # error bars from the mean
        above = [max(lead) - m for m, lead in zip(middle, leads, strict=True)]
        gap_ax.errorbar(list(sizes), middle, yerr=[below, above], fmt="o-", color=f"C{i}", capsize=3, label=name)
    gap_ax.axhline(0, color="0.5", lw=0.8)
    sizes = sorted({run["images"] for run in result["runs"]})
    for axis in (ax, gap_ax):
        axis.set_xscale("log")
        axis.set_xticks(sizes, [f"{s:,}" for s in sizes], fontsize=8)
        axis.minorticks_off()
        axis.set_xlabel("training images (CIFAR-10)")
        axis.legend(fontsize=8)
    ax.set(ylabel="test accuracy (%)", title=title)
    gap_ax.set(ylabel="points", title=f"lead over {baseline} (bar: the seeds' range)")
    return fig
