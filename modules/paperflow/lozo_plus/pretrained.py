"""The paper-scale model side: prompts of varying length as left-padded batches on the model's device, and the
classifier view of a pretrained causal LM (spec sections 4 and 8: cross-entropy over the label words' logits at
the prompt's last position; accuracy by their argmax). Plugs into `training.finetune_zo` as its `train` split and
`scorer`, in place of the smoke task's `Split` and `SyntheticScorer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PromptSplit:
    """Token rows of different lengths and their class labels; batches are padded on the left to their longest
    row (the answer position is then the last column of every row)."""

    rows: list[torch.Tensor]
    labels: torch.Tensor
    pad_id: int
    device: torch.device

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int) -> PromptSplit:
        return PromptSplit(self.rows[:n], self.labels[:n], self.pad_id, self.device)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids, attention mask, labels) of rows `idx`, left-padded, on the device."""
        rows = [self.rows[int(i)] for i in idx]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = r
            mask[i, width - len(r) :] = 1
        return ids.to(self.device), mask.to(self.device), self.labels[idx].to(self.device)


def prompt_split(ids: Sequence[Sequence[int]], labels: Sequence[int], pad_id: int, device) -> PromptSplit:
    rows = [torch.as_tensor(list(r), dtype=torch.long) for r in ids]
    return PromptSplit(rows, torch.as_tensor(list(labels), dtype=torch.long), int(pad_id), torch.device(device))


class LabelWordScorer:
    """A pretrained causal LM as a classifier over its label words' first tokens (MeZO's "train as
    classification"): logits at the last position of left-padded prompts, positions counted from the mask."""

    def __init__(self, label_tokens: Sequence[int]):
        self.label_tokens = torch.as_tensor(list(label_tokens), dtype=torch.long)

    def logits(self, model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, classes) float32 logits of the label tokens at the last position; one forward of the model."""
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=1)
        return out.logits[:, -1, self.label_tokens.to(out.logits.device)].float()  # a sharded model's last GPU

    def loss(self, model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.logits(model, ids, mask)
        return F.cross_entropy(logits, labels.to(logits.device))

    @torch.inference_mode()
    def evaluate(self, model, split: PromptSplit, chunk: int = 16) -> tuple[float, float]:
        """(mean loss, accuracy) over a split, in chunks of rows."""
        total, correct = 0.0, 0
        for start in range(0, len(split), chunk):
            ids, mask, y = split.take(torch.arange(start, min(start + chunk, len(split))))
            logits = self.logits(model, ids, mask)
            y = y.to(logits.device)
            total += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
        return total / len(split), correct / len(split)


def peak_memory(device: torch.device) -> int | None:
    """torch.cuda.max_memory_allocated on a CUDA device (spec 8), None elsewhere."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
