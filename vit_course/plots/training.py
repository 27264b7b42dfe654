"""Training figures (chapters 06-07): the loss, accuracy and learning-rate curves of a run."""

import matplotlib.pyplot as plt

from ..files import atomic_write


def plot_curves(history, path=None, title=""):
    """Loss, test accuracy and learning rate per epoch (chapters 06-07); saved atomically as a PNG at ``path``."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), layout="constrained")
    epochs = history["epoch"]
    axes[0].plot(epochs, history["train_loss"], "o-", label="train")
    axes[0].plot(epochs, history["test_loss"], "o-", label="test")
    axes[0].legend()
    axes[1].plot(epochs, [100 * a for a in history["test_acc"]], "o-", color="C1")
    axes[2].plot(epochs, history["lr"], "o-", color="C2")
    for ax, ylabel, name in zip(axes, ("cross-entropy", "%", "learning rate"),
                                ("loss", "test accuracy", "learning rate (end of epoch)"), strict=True):
        ax.set(xlabel="epoch", ylabel=ylabel, title=name)
    fig.suptitle(title)
    if path is not None:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
        plt.close(fig)
    return fig


def plot_data_scaling(result, title="test accuracy against training-set size"):
    """Chapter 07: the ViT paper's data claim in miniature, from ``benchmarks/data_scaling.py``'s JSON.

    result: {"fractions": [...], "steps": N, "models": {name: {"params": P, "test_accuracy": [...]}}}; one line per
    model, accuracy (%) against the number of training images (log axis), every run the same number of steps.
    """
    sizes = [round(f * 50_000) for f in result["fractions"]]
    fig, ax = plt.subplots(figsize=(5.4, 3.4), layout="constrained")
    for name, model in result["models"].items():
        label = f"{name} ({model['params']:,} parameters)"
        ax.plot(sizes, [100 * a for a in model["test_accuracy"]], "o-", label=label)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
    ax.minorticks_off()
    ax.set(xlabel="training images (CIFAR-10)", ylabel="test accuracy (%)",
           title=f"{title}\n({result['steps']:,} steps for every run)")
    ax.legend(fontsize=8)
    return fig
