"""Device, precision and CPU threads (vit_course.device); what the CPU is, for the records, is the lab's
(tests/test_benchmarks.py)."""

import pytest
import torch

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
    """Chapter 09 asks ``cpu_has_bf16``: True with AVX-512 BF16 or AMX among /proc/cpuinfo's flags, None without
    the file."""
    import builtins
    import io

    real_open = builtins.open
    for flags, expected in (("avx2 fma", False), ("avx512f avx512_bf16", True), ("amx_bf16", True)):
        text = f"model name\t: Some CPU\nflags\t\t: {flags}\n"
        monkeypatch.setattr(builtins, "open", lambda path, *a, text=text, **k: io.StringIO(text)
                            if path == "/proc/cpuinfo" else real_open(path, *a, **k))
        assert device.cpu_has_bf16() is expected, flags

    def no_file(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr(builtins, "open", no_file)  # no /proc/cpuinfo (macOS, Windows): unknown
    assert device.cpu_has_bf16() is None


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
