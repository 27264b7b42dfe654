"""Where to compute (every chapter that trains): the device, and how many CPU threads to use.

A GPU (CUDA, then Apple's MPS) is used when present and never required. On the CPU, a thread that shares its
core with another process makes every parallel region wait for it, so training uses only the cores that other
processes leave free, and ``ThreadWatch`` re-checks that while it trains.
"""

import os
import time

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


def cpu_flags():
    """(CPU model name, set of instruction-set flags) from /proc/cpuinfo; (None, None) where it is missing."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return name, set(flags)


BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # bfloat16 products in hardware: AVX-512 BF16, AMX


def cpu_has_bf16():
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); None where /proc/cpuinfo is missing.

    Without those instructions, bfloat16 autocast on the CPU is emulated and several times slower (chapter 09).
    """
    return _any_of(cpu_flags()[1], BF16_FLAGS)


def _any_of(flags, wanted):
    """Whether ``flags`` (a set, or None where they could not be read) holds any of ``wanted``; None if unknown."""
    return None if flags is None else bool(wanted & flags)


def machine():
    """What a measurement ran on, for the records beside it: CPU model, vector instructions, bf16, AMX, cores.

    ``amx``: Intel's matrix tiles (Sapphire Rapids and later), where bfloat16 products are far faster than on
    AVX-512 BF16 alone; None where /proc/cpuinfo is missing.
    """
    name, flags = cpu_flags()  # read once, for both flags
    return {"cpu": name, "vector_isa": torch.backends.cpu.get_cpu_capability(),
            "bf16": _any_of(flags, BF16_FLAGS), "amx": _any_of(flags, {"amx_bf16"}),
            "cores": os.cpu_count()}


def cpu_times():
    """(busy jiffies of other processes, total jiffies) since boot, over all cores; None off Linux.

    From /proc/stat (time stolen by a hypervisor counts as busy: those cycles are not ours either), minus
    this process's own time from /proc/self/stat: its threads may still be spinning after the last parallel
    region, and they are the ones that train.
    """
    try:
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (name)": field 3 (state) onwards
    except (OSError, ValueError):
        return None
    own = int(fields[11]) + int(fields[12])  # utime + stime: fields 14 and 15
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return total - idle - iowait - own, total


def busy_between(before, after):
    """Cores' worth of CPU time other processes used between two ``cpu_times()`` samples."""
    (busy0, total0), (busy1, total1) = before, after
    return max(0.0, (os.cpu_count() or 1) * (busy1 - busy0) / max(total1 - total0, 1))


def busy_cores(interval=0.5):
    """How many cores' worth of CPU time other processes use over the next ``interval`` seconds; None off Linux."""
    before = cpu_times()
    if before is None:
        return None
    time.sleep(interval)
    return busy_between(before, cpu_times())


def free_threads(busy):
    """Threads for ``busy`` cores' worth of other work: one per core left free, at least one."""
    cores = os.cpu_count() or 1
    return max(1, min(cores, round(cores - busy)))


def pick_threads(threads=None):
    """CPU threads for training: ``threads`` if given, else one per core that other work leaves free.

    Why: on 2 cores at load ~12 a CIFAR-10 step took 2.8-3.7 s with 1 thread and 6.2-10.6 s with 2, while on
    idle cores 2 threads are twice as fast as 1. Off Linux, 1 thread when the 1-minute load average reaches
    the core count (on Linux it lags by a minute, so /proc/stat decides). ``ThreadWatch`` revisits the choice.
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        return threads
    cores, available = os.cpu_count() or 1, torch.get_num_threads()
    busy = busy_cores()
    if busy is not None:
        return min(available, free_threads(busy))
    loaded = hasattr(os, "getloadavg") and os.getloadavg()[0] >= cores
    return 1 if loaded else available


class ThreadWatch:
    """Called after every training step: every ``interval`` seconds it sets torch's CPU threads to the cores
    that other processes left free since its last look (``free_threads``).

    A process that was busy only while training started no longer costs the whole run a core: the run moves
    back to all cores once the other process is done. It reads two small /proc files per look and never
    sleeps. ``changes`` lists (seconds since start, threads) for every change, for the run's metrics.
    """

    def __init__(self, interval=5.0, clock=time.monotonic, sample=cpu_times):
        self.interval, self.clock, self.sample = interval, clock, sample
        self.started = self.last_time = clock()
        self.last_sample = sample()
        self.changes = []

    def __call__(self):
        now = self.clock()
        if now - self.last_time < self.interval or self.last_sample is None:
            return
        current = self.sample()
        if current is None:
            return
        threads = free_threads(busy_between(self.last_sample, current))
        self.last_time, self.last_sample = now, current
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
            self.changes.append((round(now - self.started, 1), threads))
