"""The classifier view of the kit's tiny Llama (spec sections 4 and 7): the two label words' logits at SEP,
cross-entropy over them ("trained as classification", MeZO's protocol), accuracy by their argmax."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from paperflow.core.lm.models import build_model
from paperflow.lozo_plus.task import LABEL_WORDS, VOCAB_SIZE

_LABELS = torch.tensor(LABEL_WORDS)


def model_spec(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The kit model spec of the config's `model` block with the task's vocabulary."""
    return {**dict(model_cfg), "vocab_size": VOCAB_SIZE}


def new_model(model_cfg: Mapping[str, Any], seed: int):
    return build_model(model_spec(model_cfg), seed)


def class_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """(B, 2) logits of NO and YES at the last position (SEP); one forward of the model."""
    out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return out.logits[:, -1, _LABELS]


def loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(class_logits(model, ids), labels)


@torch.inference_mode()
def evaluate(model, ids: torch.Tensor, labels: torch.Tensor, chunk: int = 500) -> tuple[float, float]:
    """(mean loss, accuracy) over a split, in chunks of rows."""
    total, correct = 0.0, 0
    for i in range(0, len(ids), chunk):
        logits = class_logits(model, ids[i : i + chunk])
        y = labels[i : i + chunk]
        total += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(-1) == y).sum())
    return total / len(ids), correct / len(ids)
