"""Device, CPU threads and what the CPU is: the records beside every measurement."""

import pytest

from tools.results import _where
from vit_course import device


def test_pick_threads(monkeypatch):
    assert device.pick_threads(3) == 3
    with pytest.raises(ValueError, match="0"):
        device.pick_threads(0)
    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(device.torch, "get_num_threads", lambda: 2)
    for load, expected in ((0.2, 2), (1.9, 2), (2.0, 1), (9.0, 1)):  # one thread once the load fills the cores
        monkeypatch.setattr(device.os, "getloadavg", lambda load=load: (load, load, load))
        assert device.pick_threads() == expected, load
    assert device.pick_threads(2) == 2  # asked for: whatever the load


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
