"""The models of one train job in one safetensors file (the kit's `save_checkpoints`): each seed's policy, PRM and
control PRM labelled `<kind>.seed<s>`, so that a job has one output whatever its seed count."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.lm.models import load_checkpoints, save_checkpoints

KINDS = ("policy", "prm", "control")


def save_models(models: Mapping[tuple[str, int], Any], path: str | Path, spec: Mapping[str, Any]) -> Path:
    """`models` {(kind, seed): model} into one file."""
    return save_checkpoints({f"{kind}.seed{seed}": m for (kind, seed), m in models.items()}, path, spec)


def load_models(path: str | Path) -> dict[tuple[str, int], Any]:
    """{(kind, seed): model in eval mode} from a `save_models` file, every weight loaded strictly."""
    out = {}
    for label, model in load_checkpoints(path).items():
        kind, seed = label.split(".seed")
        out[(kind, int(seed))] = model
    return out
