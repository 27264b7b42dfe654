"""Device, CPU threads and what the CPU is: the records beside every measurement."""

import pytest
import torch

from tools.results import _where
from vit_course import ViT, device
from vit_course.interpret import attention_rollout, layer_attentions, mean_attention_distance


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


def test_pick_device_prefers_cuda_then_mps_then_the_cpu(monkeypatch):
    cuda, mps = [True], [True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda[0])
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps[0])
    assert device.pick_device().type == "cuda"
    cuda[0] = False
    assert device.pick_device().type == "mps"
    mps[0] = False
    assert device.pick_device().type == "cpu"
    assert device.pick_device("cpu").type == "cpu"  # asked for: no search


def test_interpretability_tools_work_where_the_model_is():
    """A model on another device than its inputs (the meta device stands in for a GPU: shapes only, and an error
    on any tensor left on the CPU): each tool moves what it builds to where the model or its weights are."""
    with torch.device("meta"):
        model = ViT(image_size=8, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2)
    weights = layer_attentions(model, torch.zeros(3, 3, 8, 8))  # the images on the CPU
    assert [w.device.type for w in weights] == ["meta", "meta"] and weights[0].shape == (3, 2, 5, 5)
    assert attention_rollout(weights).device.type == "meta"
    assert mean_attention_distance(weights[0], 2, 4).shape == (2,)


def test_pick_device_refuses_cuda_where_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda' was asked for, but torch.cuda.is_available\\(\\) is False"):
        device.pick_device("cuda:0")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'mps' was asked for, but torch.backends.mps.is_available\\(\\) is "):
        device.pick_device("mps")
    assert device.pick_device("meta").type == "meta"  # any other device as asked
