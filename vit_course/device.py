"""Which device to compute on: CUDA, then Apple's MPS, then the CPU."""

import torch


def pick_device(device=None):
    """Return ``torch.device(device)`` if given, else the best one available here.

    Nothing in the course needs a GPU; it only runs faster on one.
    """
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")

