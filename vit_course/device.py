"""Where to compute (every chapter that trains): the device, in what precision, how many CPU threads, and whether
the CPU multiplies bfloat16 natively (chapter 09).

A GPU (CUDA, then Apple's MPS) is used when present and never required. On the CPU, training takes one thread
per core, or a single one when other processes already keep the cores busy (``pick_threads``).
"""

import os

import torch


def pick_device(device=None):
    """Return ``torch.device(device)`` if given, else the best one available here.

    Nothing in the course needs a GPU; it only runs faster on one.
    """
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but torch.cuda.is_available() is False here (no GPU, or a "
                             "CPU build of PyTorch; on Colab: Runtime > Change runtime type): leave the device out "
                             "to use the best one available")
        if device.type == "mps" and not _mps_available():
            raise ValueError("device 'mps' was asked for, but torch.backends.mps.is_available() is False here (MPS "
                             "is the GPU of a Mac with Apple silicon, macOS 12.3 or later): leave the device out to "
                             "use the best one available")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available():
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def resume_state(device, scaler=None):
    """What a run on ``device`` resumes from besides its weights and optimizer (``restore_state``): the CPU
    generator's state as "rng"; on a GPU the device's too, since dropout and stochastic depth draw from it there;
    and a float16 run's GradScaler, whose loss scale would otherwise start afresh."""
    state = {"rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    elif device.type == "mps":
        state["mps_rng"] = torch.mps.get_rng_state()
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    return state


def restore_state(state, device, scaler=None):
    """Restore what ``resume_state`` saved; a GPU's own generator only when resuming on that kind of device."""
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], device)
    if "mps_rng" in state and device.type == "mps":
        torch.mps.set_rng_state(state["mps_rng"])
    if "scaler" in state and scaler is not None:
        scaler.load_state_dict(state["scaler"])


BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # bfloat16 products in hardware: AVX-512 BF16, AMX


def cpu_has_bf16():
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); None where /proc/cpuinfo is missing.

    Without those instructions, bfloat16 autocast on the CPU is emulated and several times slower (chapter 09).
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    return bool(BF16_FLAGS & set(flags))


def pick_threads(threads=None):
    """CPU threads for training: ``threads`` if given, else torch's default (one per core), or 1 on a busy machine.

    Busy: the 1-minute load average has reached the core count. A thread that shares its core with another
    process makes every parallel region wait for it: on 2 cores at load ~12 a CIFAR-10 step took 2.8-3.7 s with
    1 thread and 6.2-10.6 s with 2, while on idle cores 2 threads are twice as fast as 1. The average trails the
    machine by about a minute, so a run started right after another one ended may see it; ``threads`` decides then.
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        return threads
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] >= (os.cpu_count() or 1)
    return 1 if busy else torch.get_num_threads()


def precision(amp, device):
    """What a run multiplies in: "bf16", "fp16" or "fp32".

    amp="auto": on a CUDA GPU bf16 where the card computes in it (compute capability 8.0+), else fp16 (a T4 only
    emulates bf16); float32 on the CPU and MPS (chapter 09). "bf16" on any device, "fp16" on CUDA. "off": fp32.
    """
    if amp not in ("auto", "bf16", "fp16", "off") or (amp == "fp16" and device.type != "cuda"):
        raise ValueError(f'amp must be "auto", "bf16", "fp16" (CUDA only) or "off", got {amp!r} on {device}')
    if amp != "auto":
        return "fp32" if amp == "off" else amp
    if device.type == "cuda":
        return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    return "fp32"


def amp_settings(amp, device):
    """(autocast context or None, GradScaler or None) for ``amp`` on ``device`` (see ``precision``): float16 on a
    GPU needs a GradScaler, so that small gradients survive; bfloat16 keeps float32's range and needs none."""
    kind = precision(amp, device)
    if kind == "fp32":
        return None, None
    scaler = torch.amp.GradScaler(device.type) if kind == "fp16" else None
    return torch.autocast(device.type, dtype=torch.bfloat16 if kind == "bf16" else torch.float16), scaler


__all__ = ["amp_settings", "cpu_has_bf16", "pick_device", "pick_threads", "precision"]
