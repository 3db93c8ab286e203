"""The kit's one-process sharding of a model over a job's GPUs (paperflow.core.lm.sharding): the memory map, the
refusals (too few GPUs, modules off the GPUs), the peak memory summed over devices, and a tiny model loaded through
the real from_pretrained path with a CPU-only map."""

from __future__ import annotations

import pytest
import torch

from paperflow.core.config import ConfigError
from paperflow.core.lm import sharding


def test_max_memory_caps_each_gpu_keeps_the_cpu_out_and_refuses_too_few_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"train gpus = 4 but this job sees 0 CUDA"):
        sharding.max_memory(4, 70, "train gpus")
    with pytest.raises(ConfigError, match=r"vlms\.big\.gpus = 4 but this job sees 2 CUDA"):
        sharding.max_memory(4, "70GiB", "vlms.big.gpus", visible=2)
    with pytest.raises(ConfigError, match=r"g = 0: a job needs at least one device"):
        sharding.max_memory(0, 70, "g")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert sharding.max_memory(4, 70, "g") == {0: "70GiB", 1: "70GiB", 2: "70GiB", 3: "70GiB", "cpu": "0GiB"}
    assert sharding.max_memory(2, "60GiB", "g") == {0: "60GiB", 1: "60GiB", "cpu": "0GiB"}
    assert sharding.max_memory(2, 37.5, "g") == {0: "37.5GiB", 1: "37.5GiB", "cpu": "0GiB"}
    props = type("P", (), {"total_memory": 80 * 2**30})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    assert sharding.max_memory(2, None, "g") == {0: "80GiB", 1: "80GiB", "cpu": "0GiB"}
    assert sharding.max_memory(2, None, "g", device="cpu") == {"cpu": "1024GiB"}
    assert sharding.max_memory(2, 3, "g", device="cpu") == {"cpu": "6GiB"}


def test_a_model_placed_off_its_gpus_is_refused_naming_the_key_and_the_hint():
    sharding.check_placement({"vision_tower": 0, "language_model.layers.0": 1, "lm_head": "cuda:3"}, "vlms.big")
    with pytest.raises(RuntimeError, match=r"vlms\.big: .*placed on \['cpu', 'disk'\]\); raise it"):
        sharding.check_placement({"a": 0, "b": "cpu", "c": "disk"}, "vlms.big", hint="raise it")
    sharding.check_placement({"a": "cpu"}, "k", allow_cpu=True)
    with pytest.raises(RuntimeError, match=r"placed on \['disk'\]"):
        sharding.check_placement({"a": "cpu", "b": "disk"}, "k", allow_cpu=True)


def test_peak_memory_is_summed_over_the_cuda_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: {0: 5, 1: 7}[d.index])
    assert sharding.peak_memory_total([torch.device("cuda:0"), torch.device("cuda:1")]) == 12
    assert sharding.peak_memory_total([torch.device("cpu")]) is None


def test_a_tiny_model_loads_through_from_pretrained_with_a_cpu_only_map(tmp_path):
    from transformers import AutoModelForCausalLM

    from paperflow.core.lm.models import build_model, save_model

    spec = {
        "arch": "llama",
        "vocab_size": 16,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16,
    }
    reference = build_model(spec, seed=0)
    save_model(reference, tmp_path)
    model = sharding.load_sharded(AutoModelForCausalLM, tmp_path, "float32", sharding.max_memory(2, 1, "g", "cpu"), "g")
    assert set(getattr(model, "hf_device_map", {"": "cpu"}).values()) == {"cpu"}  # a CPU-only map sets none
    assert sharding.model_devices(model) == [torch.device("cpu")]
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(model(ids).logits, reference(ids).logits)
