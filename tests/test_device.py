"""Device and CPU-thread policy: the watch that moves training back to all cores after a brief blip."""

import pytest
import torch

from vit_course import device
from vit_course.results import _where


def test_pick_threads(monkeypatch):
    assert device.pick_threads(3) == 3
    with pytest.raises(ValueError, match="0"):
        device.pick_threads(0)
    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(device.torch, "get_num_threads", lambda: 2)
    for busy, expected in ((0.1, 2), (0.7, 1), (1.0, 1), (5.0, 1)):
        monkeypatch.setattr(device, "busy_cores", lambda busy=busy: busy)
        assert device.pick_threads() == expected, busy
    monkeypatch.setattr(device, "busy_cores", lambda: None)  # off Linux: the load average decides
    monkeypatch.setattr(device.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert device.pick_threads() == 1
    monkeypatch.setattr(device.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert device.pick_threads() == 2


def test_free_threads(monkeypatch):
    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    assert [device.free_threads(b) for b in (0.0, 0.4, 0.7, 1.0, 1.9, 5.0)] == [2, 2, 1, 1, 1, 1]


def test_thread_watch_survives_a_transient_busy_process(monkeypatch):
    """Another process busy for one interval takes a core away; once it is gone, the run gets both back."""
    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    threads = [2]
    monkeypatch.setattr(device.torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(device.torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    now, jiffies = [0.0], [[0, 0]]  # the clock; (busy jiffies of others, total jiffies)

    def advance(seconds, other_cores):  # ``seconds`` pass with ``other_cores`` used by other processes
        now[0] += seconds
        jiffies[0] = [jiffies[0][0] + 100 * seconds * other_cores, jiffies[0][1] + 200 * seconds]

    watch = device.ThreadWatch(interval=10, clock=lambda: now[0], sample=lambda: tuple(jiffies[0]))
    advance(5, 1.0)
    watch()  # too soon to look again
    assert threads[0] == 2
    advance(6, 1.0)
    watch()  # another process kept a core busy: one thread
    assert threads[0] == 1
    advance(11, 0.05)
    watch()  # it is gone: both cores again
    assert threads[0] == 2 and watch.changes == [(11.0, 1), (22.0, 2)]


def test_thread_watch_reads_this_machine():
    """On Linux the real sample works, and an idle interval changes nothing beyond the core count."""
    before = torch.get_num_threads()
    watch = device.ThreadWatch(interval=0.0)
    try:
        watch()
        assert 1 <= torch.get_num_threads() <= (device.os.cpu_count() or 1)
    finally:
        torch.set_num_threads(before)


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch):
    for flags, expected in (({"avx2", "fma"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_bf16"}, True)):
        monkeypatch.setattr(device, "cpu_flags", lambda flags=flags: ("some CPU", flags))
        assert device.cpu_has_bf16() is expected, flags
    monkeypatch.setattr(device, "cpu_flags", lambda: (None, None))  # no /proc/cpuinfo: unknown
    assert device.cpu_has_bf16() is None
    assert set(device.machine()) == {"cpu", "vector_isa", "bf16", "amx", "cores"}
    assert device.machine()["amx"] is None


def test_machine_records_amx_and_the_tables_show_it(monkeypatch):
    for flags, amx in (({"avx512f", "avx512_bf16"}, False), ({"avx512f", "avx512_bf16", "amx_bf16"}, True)):
        monkeypatch.setattr(device, "cpu_flags", lambda flags=flags: ("Xeon", flags))
        record = device.machine()
        assert record["amx"] is amx and record["bf16"] is True
        assert _where(record).endswith(", AMX") is amx, _where(record)
