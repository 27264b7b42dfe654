"""Mixed precision (chapters 06, 07 and 09): which reduced precision a run trains in, and the autocast for it.

On a GPU the choice is the card's (bf16 where supported, else fp16 with a GradScaler). On a CPU it is float32,
unless a recipe asks for ``amp="native"``: then bf16 where the CPU has bf16 instructions *and* a timed
training step says it is faster there, because the instructions alone do not make it fast (chapter 09).
"""

import copy
import time
from contextlib import nullcontext

import torch
from tqdm.auto import tqdm

from .device import cpu_has_bf16
from .train import train_step


def amp_dtype(amp, device):
    """The reduced precision ``amp`` means on ``device``: "bf16", "fp16" or None (float32 throughout).

    amp: "auto": bf16 on CUDA GPUs that support it, else fp16; on MPS and the CPU none (a CPU without native
    bf16 emulates it, several times slower: chapter 09 measures it). "native": as "auto", and bf16 on a CPU
    that has bf16 instructions (``device.cpu_has_bf16``), where ``resolve_amp`` then times whether it pays.
    "bf16", "fp16": always; "off"/None/False.
    """
    if amp in (None, False, "off", "none"):
        return None
    if amp not in ("auto", "native", "bf16", "fp16"):
        raise ValueError(f'amp must be "auto", "native", "bf16", "fp16" or "off", got {amp!r}')
    if amp in ("bf16", "fp16"):
        return amp
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if amp == "native" and device.type == "cpu" and cpu_has_bf16() else None


def bf16_pays(model, images, labels, rounds=3, margin=0.95):
    """Whether a training step of ``model`` on images (b, C, H, W), labels (b,) is faster under bfloat16 autocast
    on this CPU: -> {"fp32_ms", "bf16_ms": the best of ``rounds`` steps each, "bf16": True if it pays}.

    A CPU's flags say whether it has bfloat16 instructions, not whether they are fast: under bf16 the cifar10
    recipe's step was 1.23 times as fast on one AVX-512 BF16 CPU and about half as fast on another, without AMX
    (benchmarks/train_throughput.py --bf16). So the step is timed, on a copy of the model (the run's weights and
    random state stay as they were): one warm-up step each way, then float32 and bf16 alternated, so a change
    in the machine's speed hits both. bf16 must be faster by more than 1 - ``margin``: it costs precision.
    """
    trial, rng = copy.deepcopy(model).train(), torch.get_rng_state()
    optimizer = torch.optim.AdamW(trial.parameters(), lr=1e-6)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)

    def seconds(bf16):
        tick = time.perf_counter()
        with autocast if bf16 else nullcontext():
            train_step(trial, images, labels, optimizer)
        return time.perf_counter() - tick

    try:
        seconds(False), seconds(True)  # the first calls allocate and choose kernels
        times = [(seconds(False), seconds(True)) for _ in range(rounds)]
    finally:
        torch.set_rng_state(rng)
    fp32, bf16 = min(t[0] for t in times), min(t[1] for t in times)
    return {"fp32_ms": round(fp32 * 1000, 1), "bf16_ms": round(bf16 * 1000, 1), "bf16": bf16 < margin * fp32}


def resolve_amp(amp, device, model, loader, progress=False):
    """The precision a run trains in: -> (``amp_dtype(amp, device)``, None), except for "native" on a CPU with
    bf16 instructions: (bf16 if ``bf16_pays`` on the first batch of ``loader``, else None; the trial's timings).

    loader: one whose iteration changes no random state (a test loader: fixed order, no augmentation).
    """
    dtype = amp_dtype(amp, device)
    if amp != "native" or device.type != "cpu" or dtype != "bf16":
        return dtype, None
    images, labels = next(iter(loader))
    trial = bf16_pays(model.to(device), images.to(device), labels.to(device))
    if progress:
        tqdm.write(f"a training step took {trial['bf16_ms']:.0f} ms under bf16 autocast, {trial['fp32_ms']:.0f} ms "
                   f"in float32: training in {'bf16' if trial['bf16'] else 'float32'}")
    return ("bf16" if trial["bf16"] else None), trial


def amp_settings(amp, device):
    """(autocast context or None, GradScaler or None) for ``amp`` (see ``amp_dtype``) on ``device``."""
    dtype = amp_dtype(amp, device)
    if dtype is None:
        return None, None
    scaler = torch.amp.GradScaler(device.type) if dtype == "fp16" and device.type == "cuda" else None
    return torch.autocast(device.type, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16), scaler


__all__ = ["amp_dtype", "amp_settings", "bf16_pays", "resolve_amp"]
