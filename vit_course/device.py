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


def describe(device):
    """One line naming the device, e.g. for a notebook's setup cell."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "mps":
        return "mps (Apple GPU)"
    return f"cpu ({torch.get_num_threads()} threads)"
