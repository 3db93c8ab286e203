"""core.device.pick: auto follows what the job sees, cpu is forced, a GPU demanded where there is none fails naming
the key, a typo names the choices."""

from __future__ import annotations

import pytest
import torch

from paperflow.core.config import ConfigError
from paperflow.core.device import pick


def test_auto_follows_cuda_availability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick("auto").type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick("auto").type == "cuda"


def test_cpu_is_forced_even_with_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_fails_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"train\.device = 'cuda' but torch sees no CUDA device"):
        pick("cuda", key="train.device")


def test_cuda_index_beyond_the_visible_devices_fails(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="only 1 CUDA device"):
        pick("cuda:1", key="device")


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "cuda1", "", None])
def test_unknown_values_name_the_choices(bad):
    with pytest.raises(ConfigError, match="choose one of auto, cpu, cuda"):
        pick(bad, key="model.device")
