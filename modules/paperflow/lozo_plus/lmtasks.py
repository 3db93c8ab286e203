"""Paper-scale tasks trained with the LM loss (spec section 4: COPA, ReCoRD, SQuAD, DROP), as MeZO runs them
(`large_models/tasks.py`, `templates.py`, `run.py`; the code here is written anew from their formats).

- Multiple choice (COPA, ReCoRD): the prompt is MeZO's `encode`, each candidate's completion the rest of its
  `verbalize` text (COPA: the choice, its first word lower-cased unless "I", after "premise so " / "premise because ";
  ReCoRD, MeZO's GPT-3 template: the passage with "@highlight\\n" read as "- ", then "\\n-", the completion the query
  with "@placeholder" replaced by the candidate entity). Training is the LM loss on the gold completion (ReCoRD: the
  first answer); the prediction is the candidate with the highest mean log-probability of its completion tokens
  (MeZO's default scoring), correct when it is a gold one (ReCoRD: any of the answers).
- Generation (SQuAD, DROP): the prompt ends with "Answer:", training is the LM loss on " {first answer}\\n"; the
  evaluation greedy-decodes up to `max_new_tokens` (MeZO: 50) and stops at a newline or EOS, and scores exact match
  and token F1, SQuAD's as its official script defines them (max over the gold answers) and DROP's as its official
  `drop_eval.py` does (number-aware bags, max over the gold answers). The Hub's `ucinlp/drop` keeps one list of
  spans per question; MeZO reads them as alternative answers and so does this module.

Token layout: a row is the prompt's tokens (the tokenizer's specials included) then the completion's; the prompt is
tokenized without its trailing spaces (COPA's "so "), the completion is what tokenizing prompt + completion adds,
which must keep the prompt's tokens as a prefix. Rows longer than `max_length` lose the prompt's first tokens.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from paperflow.lozo_plus.lmtask_formats import CHOICE, LM_TASKS


def check_columns(task: str, frame: pd.DataFrame) -> None:
    missing = [c for c in LM_TASKS[task].columns if c not in frame.columns]
    if missing:
        raise ValueError(f"task {task!r}: columns {missing} missing (have {list(frame.columns)})")


def completion_ids(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """(prompt tokens, completion tokens): the prompt without trailing spaces, the completion what tokenizing
    prompt + completion adds after it."""
    head = list(tokenizer(prompt.rstrip(" "))["input_ids"])
    full = list(tokenizer(prompt + completion)["input_ids"])
    if full[: len(head)] != head or len(full) == len(head):
        raise ValueError(f"the prompt's tokens are not a prefix of prompt + {completion!r}")
    return head, full[len(head) :]


def _fit(prompt: list[int], completion: list[int], max_length: int) -> tuple[list[int], bool]:
    """The prompt cut from the left so prompt + completion fit `max_length` (a completion alone must fit)."""
    room = max_length - len(completion)
    if room < 1:
        raise ValueError(f"a completion of {len(completion)} tokens leaves no room for the prompt in {max_length}")
    return prompt[-room:], len(prompt) > room


def encode_rows(tokenizer, task: str, frame: pd.DataFrame, max_length: int) -> tuple[pd.DataFrame, int]:
    """One row per example: prompt, ids (prompt tokens), target (training completion tokens), and for a choice
    task the candidates' tokens and the gold indices, for a generative one the gold answers. Returns (frame, how
    many prompts were cut)."""
    spec = LM_TASKS[task]
    check_columns(task, frame)
    rows, cut = [], 0
    for r in frame.to_dict("records"):
        text = spec.prompt(r)
        head, target = completion_ids(tokenizer, text, spec.target(r))
        ids, was_cut = _fit(head, target, max_length)
        row = {"prompt": text, "ids": ids, "target": target}
        if spec.kind == CHOICE:
            cands = [completion_ids(tokenizer, text, c)[1] for c in spec.candidates(r)]
            gold = spec.gold(r)
            if not gold:
                raise ValueError(f"task {task!r}: no candidate is a gold answer ({r.get('answers')})")
            longest = max(len(c) for c in cands)
            ids_c, was_cut_c = _fit(head, [0] * longest, max_length)
            row |= {"candidates": cands, "gold": gold, "choice_ids": ids_c}
            was_cut = was_cut or was_cut_c
        else:
            row |= {"answers": spec.candidates(r)}
        cut += was_cut
        rows.append(row)
    return pd.DataFrame(rows), cut


@dataclass
class CompletionSplit:
    """Prompt + completion token rows; batches are left-padded, so every completion ends at the last column, and
    the labels are -100 outside the completion."""

    prompts: list[torch.Tensor]
    targets: list[torch.Tensor]
    pad_id: int
    device: torch.device

    def __len__(self) -> int:
        return len(self.prompts)

    def head(self, n: int) -> CompletionSplit:
        return CompletionSplit(self.prompts[:n], self.targets[:n], self.pad_id, self.device)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids, attention mask, labels) of rows `idx` on the device."""
        return pad_rows(
            [self.prompts[int(i)] for i in idx], [self.targets[int(i)] for i in idx], self.pad_id, self.device
        )


def pad_rows(prompts, targets, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = [torch.cat([p, t]) for p, t in zip(prompts, targets)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, targets)):
        ids[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
        labels[i, width - len(t) :] = t
    return ids.to(device), mask.to(device), labels.to(device)


def completion_split(prompts, targets, pad_id: int, device) -> CompletionSplit:
    as_t = [torch.as_tensor(list(p), dtype=torch.long) for p in prompts]
    return CompletionSplit(
        as_t, [torch.as_tensor(list(t), dtype=torch.long) for t in targets], int(pad_id), torch.device(device)
    )


def _first_device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


class CompletionScorer:
    """A causal LM scored by its loss on the completion tokens (MeZO's non-classification training): the logits of
    the last `completion width + 1` positions only, the mean NLL over the batch's completion tokens."""

    @staticmethod
    def token_logprobs(model, ids, mask, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, W) float32 log-probabilities of the label tokens and their mask, W the completion width."""
        width = int((labels != -100).sum(-1).max())
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=width + 1
        )
        logits = out.logits[:, :-1].float()
        target = labels[:, -width:].to(logits.device)
        keep = target != -100
        logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return logp * keep, keep

    def loss(self, model, ids, mask, labels) -> torch.Tensor:
        logp, keep = self.token_logprobs(model, ids, mask, labels)
        return -logp.sum() / keep.sum()

    @torch.inference_mode()
    def evaluate(self, model, split: CompletionSplit, chunk: int = 8) -> tuple[float, float]:
        """(mean completion-token loss, the fraction of completion tokens that are the argmax), teacher-forced:
        the curve's train loss and accuracy (the task metric comes from `choice_accuracy` / `generate_scores`)."""
        nll, right, count = 0.0, 0, 0
        for start in range(0, len(split), chunk):
            ids, mask, labels = split.take(torch.arange(start, min(start + chunk, len(split))))
            width = int((labels != -100).sum(-1).max())
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=width + 1
            )
            logits = out.logits[:, :-1].float()
            target = labels[:, -width:].to(logits.device)
            keep = target != -100
            nll += float(F.cross_entropy(logits[keep], target[keep], reduction="sum"))
            right += int((logits.argmax(-1)[keep] == target[keep]).sum())
            count += int(keep.sum())
        return nll / count, right / count


@torch.inference_mode()
def choice_accuracy(model, frame: pd.DataFrame, pad_id: int, chunk: int = 8) -> tuple[float, list[int]]:
    """Accuracy of the candidate with the highest mean completion log-probability, and the predicted indices."""
    device = _first_device(model)
    flat = [
        (i, torch.as_tensor(list(r["choice_ids"])), torch.as_tensor(list(c)))
        for i, r in enumerate(frame.to_dict("records"))
        for c in r["candidates"]
    ]
    scores: list[float] = []
    scorer = CompletionScorer()
    for start in range(0, len(flat), chunk):
        part = flat[start : start + chunk]
        ids, mask, labels = pad_rows([p for _, p, _ in part], [t for _, _, t in part], pad_id, device)
        logp, keep = scorer.token_logprobs(model, ids, mask, labels)
        scores += (logp.sum(-1) / keep.sum(-1)).tolist()
    preds, at, right = [], 0, 0
    for r in frame.to_dict("records"):
        n = len(r["candidates"])
        pick = int(np.argmax(scores[at : at + n]))
        at += n
        preds.append(pick)
        right += pick in set(int(g) for g in r["gold"])
    return right / len(frame), preds


@torch.inference_mode()
def greedy_generate(
    model, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int, chunk: int = 4
) -> list[str]:
    """Greedy continuations of left-padded prompts (transformers' generate, no sampling), cut at the first newline,
    stripped (MeZO: eos = newline or the tokenizer's EOS, then `.strip()`)."""
    device = _first_device(model)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    eos = [t for t in {tokenizer.eos_token_id, newline[-1] if newline else None} if t is not None]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    out = []
    for start in range(0, len(prompts), chunk):
        rows = [torch.as_tensor(list(p), dtype=torch.long) for p in prompts[start : start + chunk]]
        ids, mask, _ = pad_rows(rows, [torch.zeros(0, dtype=torch.long)] * len(rows), pad, device)
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=int(max_new_tokens),
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        for row in gen[:, ids.shape[1] :]:
            text = tokenizer.decode(row.tolist(), skip_special_tokens=True)
            out.append(text.split("\n")[0].strip())
    return out


# SQuAD v1.1's official evaluation: normalise (lower case, no punctuation, no articles, single spaces), then exact
# match and bag-of-tokens F1, each the max over the gold answers.
def squad_normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_f1(prediction: str, gold: str) -> float:
    pred, ref = squad_normalize(prediction).split(), squad_normalize(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    em = max(float(squad_normalize(prediction) == squad_normalize(g)) for g in golds)
    return em, max(squad_f1(prediction, g) for g in golds)


# DROP's official evaluation (allennlp-reading-comprehension drop_eval.py): tokens split on spaces and hyphens, each
# lower-cased, stripped of punctuation unless a number, numbers written as floats, articles removed; an answer is a
# bag of tokens per span; F1 aligns predicted and gold spans (linear assignment), a gold span with numbers scores 0
# against a span that shares none of them; EM compares the normalised span sets.
def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _drop_token(token: str) -> str:
    token = token.lower()
    if not _is_number(token):
        token = "".join(ch for ch in token if ch not in set(string.punctuation))
    if _is_number(token):
        token = str(float(token))
    token = re.sub(r"\b(a|an|the)\b", " ", token, flags=re.UNICODE)
    return " ".join(token.split())


def drop_normalize(text: str) -> str:
    parts = [_drop_token(t) for t in re.split(" |-", text)]
    return " ".join(p for p in parts if p.strip()).strip()


def _bags(answer: str | Sequence[str]) -> tuple[list[str], list[set[str]]]:
    spans = [answer] if isinstance(answer, str) else list(answer)
    norm = [drop_normalize(s) for s in spans]
    return norm, [set(n.split()) for n in norm]


def _bag_f1(pred: set[str], gold: set[str]) -> float:
    inter = len(gold & pred)
    precision = 1.0 if not pred else inter / len(pred)
    recall = 1.0 if not gold else inter / len(gold)
    return 0.0 if precision == 0.0 and recall == 0.0 else 2 * precision * recall / (precision + recall)


def _numbers_match(gold: set[str], pred: set[str]) -> bool:
    gold_numbers = {w for w in gold if _is_number(w)}
    return not gold_numbers or bool(gold_numbers & {w for w in pred if _is_number(w)})


def drop_metrics(prediction: str | Sequence[str], gold: str | Sequence[str]) -> tuple[float, float]:
    """(EM, F1) of one prediction against one gold answer, as drop_eval.get_metrics (F1 rounded to 2 places)."""
    from scipy.optimize import linear_sum_assignment

    pred_spans, pred_bags = _bags(prediction)
    gold_spans, gold_bags = _bags(gold)
    em = float(set(pred_spans) == set(gold_spans) and len(pred_spans) == len(gold_spans))
    scores = np.zeros((len(gold_bags), len(pred_bags)))
    for i, g in enumerate(gold_bags):
        for j, p in enumerate(pred_bags):
            if _numbers_match(g, p):
                scores[i, j] = _bag_f1(p, g)
    rows, cols = linear_sum_assignment(-scores)
    best = np.zeros(max(len(gold_bags), len(pred_bags)))
    for r, c in zip(rows, cols):
        best[r] = max(best[r], scores[r, c])
    return em, round(float(np.mean(best)), 2)


def drop_scores(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    pairs = [drop_metrics(prediction, g) for g in golds]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def generate_scores(task: str, predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> tuple[float, float]:
    """Mean (EM, F1) over the examples with the task's official metric."""
    score = squad_scores if task == "squad" else drop_scores
    pairs = [score(p, list(a)) for p, a in zip(predictions, answers)]
    return float(np.mean([p[0] for p in pairs])), float(np.mean([p[1] for p in pairs]))
