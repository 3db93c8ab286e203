"""The models of one train job in one safetensors file: each seed's policy, PRM and control PRM under the key
prefix `<kind>.seed<s>.`, the kit's model spec in the metadata (one output per job whatever its seed count)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.lm.models import SPEC_METADATA_KEY, build_model

KINDS = ("policy", "prm", "control")


def save_models(models: Mapping[tuple[str, int], Any], path: str | Path, spec: Mapping[str, Any]) -> Path:
    """`models` {(kind, seed): model} into one file."""
    from safetensors.torch import save_file

    tensors = {
        f"{kind}.seed{seed}.{name}": t.detach().contiguous().clone()
        for (kind, seed), model in models.items()
        for name, t in model.state_dict().items()
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={SPEC_METADATA_KEY: json.dumps(dict(spec), sort_keys=True)})
    return Path(path)


def load_models(path: str | Path) -> dict[tuple[str, int], Any]:
    """{(kind, seed): model in eval mode} from a `save_models` file, every weight loaded strictly."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        spec = json.loads((fh.metadata() or {})[SPEC_METADATA_KEY])
        grouped: dict[tuple[str, int], dict[str, Any]] = {}
        for key in fh.keys():
            kind, seed, name = key.split(".", 2)
            grouped.setdefault((kind, int(seed.removeprefix("seed"))), {})[name] = fh.get_tensor(key)
    out = {}
    for label, state in grouped.items():
        model = build_model(spec, seed=0)
        model.load_state_dict(state, strict=True)
        out[label] = model.eval()
    return out
