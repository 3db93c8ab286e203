"""dualreform's download stage, light enough for the `base` env (no torch): SynthConvQA from its seed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.io import write_frame
from paperflow.dualreform.data import generate


def download(source: Mapping[str, Any], world: Mapping[str, Any], world_seed: int, out_passages: str, out_turns: str):
    """Tiny/smoke: SynthConvQA from its seed. Paper scale (TopiOCQA) has its own download rules (paper.smk,
    `paperflow.dualreform.paper`): another source kind is refused here by name."""
    if source["kind"] != "synthetic":
        raise ConfigError(
            f"dualreform source kind {source['kind']!r}: this download makes SynthConvQA only; TopiOCQA is "
            "downloaded by workflows/dualreform/paper.smk (source.kind topiocqa)"
        )
    w = generate(world, world_seed)
    meta = {"world_seed": world_seed, "entities": w.entities, "aspect_values": w.aspect_values}
    write_frame(out_passages, w.passages, meta)
    write_frame(out_turns, w.turns, {"world_seed": world_seed})
    return w
