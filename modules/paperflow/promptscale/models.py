"""The three sequence models of the designer world on the kit (tiny Qwen2 from a config, word-level tokenizer,
`sequence_logprobs`; sampling through the kit's local OpenAI-compatible server and paper scale's client path,
`served` / `generate`) and one template per model, so that q and p score exactly the spans they generate
(spec section 9):

    p_theta (prompt model):     <bos> <c> c... <z> | z... <x> x... <eos>      log p(z | c) = z + <x>; log p(x | z, c) = x + <eos>
    q_phi (rationale model):    <bos> <c> c... <x> x... <z> | z... <eos>     log q(z | c, x) = z + <eos>
    direct (no rationale):      <bos> <c> c... <x> | x... <eos>              log p(x | c)
    solver:                     <bos> x... = | answer digits <eos>

"|" separates prompt and completion; a completion's log-prob is the sum of its tokens' log-probs (EOS included).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.local_server import LocalServer
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.lm.serve import Client
from paperflow.core.lm.tokenizer import encode_pairs, word_level_tokenizer
from paperflow.promptscale import world as w
from paperflow.promptscale.vllm_server import complete_each

CHUNK = 1024
SERVER_BATCH_ROWS = 4096  # rows the local server samples in one batch
SERVER_CONCURRENCY = 64  # requests in flight from one client


def tokenizer():
    return word_level_tokenizer(w.WORDS)


def model_spec(model: Mapping[str, Any], tok) -> dict[str, Any]:
    return {**model, "vocab_size": len(tok.get_vocab())}


def p_pair(c, z, x) -> tuple[tuple, tuple]:
    return ("<c>", *c, "<z>"), (*z, "<x>", *x)


def q_pair(c, x, z) -> tuple[tuple, tuple]:
    return ("<c>", *c, "<x>", *x, "<z>"), tuple(z)


def direct_pair(c, x) -> tuple[tuple, tuple]:
    return ("<c>", *c, "<x>"), tuple(x)


def answer_words(value: int) -> tuple[str, ...]:
    return tuple(str(value)) if value >= 0 else ("-", *str(-value))


def solver_pair(x, answer: int) -> tuple[tuple, tuple]:
    return tuple(x), answer_words(answer)


@dataclass
class Encoded:
    """Every (prompt, completion) pair encoded once (left-padded); `batch(idx)` cuts the columns no row uses."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor

    @staticmethod
    def of(tok, pairs: Sequence[tuple[tuple, tuple]]) -> Encoded:
        b = encode_pairs(tok, [p for p, _ in pairs], [c for _, c in pairs])
        return Encoded(b["input_ids"], b["attention_mask"], b["completion_mask"])

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def batch(self, idx) -> dict[str, torch.Tensor]:
        mask = self.attention_mask[idx]
        start = int((mask.sum(0) == 0).sum())  # left padding shared by every row of this batch
        return {
            "input_ids": self.input_ids[idx][:, start:],
            "attention_mask": mask[:, start:],
            "completion_mask": self.completion_mask[idx][:, start:],
        }


def token_logprobs(model, enc: Encoded) -> torch.Tensor:
    """Per-token log-probs of every row (no grad), chunked."""
    with torch.no_grad():
        return sequence_logprobs(model, enc.input_ids, enc.attention_mask, chunk_size=CHUNK)


def completion_logprob(model, tok, pairs) -> np.ndarray:
    """sum of the completion's token log-probs (EOS included) for each pair, float64."""
    enc = Encoded.of(tok, pairs)
    lp = token_logprobs(model, enc)
    return (lp * enc.completion_mask).sum(1).double().numpy()


def p_scores(model, tok, triples) -> tuple[np.ndarray, np.ndarray]:
    """(log p(z | c), log p(x | z, c)) of (c, z, x) triples: the completion z <x> x <eos> split at its spans."""
    pairs = [p_pair(c, z, x) for c, z, x in triples]
    enc = Encoded.of(tok, pairs)
    lp = token_logprobs(model, enc).double()
    width = lp.shape[1]
    x_len = torch.tensor([len(x) + 1 for _, _, x in triples])
    z_len = torch.tensor([len(z) + 1 for _, z, _ in triples])
    col = torch.arange(width)[None]
    x_mask = col >= width - x_len[:, None]
    z_mask = (col >= width - x_len[:, None] - z_len[:, None]) & ~x_mask
    return (lp * z_mask).sum(1).numpy(), (lp * x_mask).sum(1).numpy()


def new_model(spec: Mapping[str, Any], seed: int):
    return build_model(spec, seed)


def sft_rows(tok, pairs: Sequence[tuple[tuple, tuple]]) -> list[dict[str, str]]:
    """(prompt, completion) word pairs as the {"prompt", "completion"} text rows TRL's SFTTrainer reads: the prompt
    starts with BOS and ends with a space (TRL joins the two strings), the completion ends with EOS, so TRL's tokens
    and completion mask are exactly `Encoded.of`'s (the layout `p_scores` and `completion_logprob` score; tested)."""
    return [
        {"prompt": " ".join((tok.bos_token, *prompt)) + " ", "completion": " ".join((*completion, tok.eos_token))}
        for prompt, completion in pairs
    ]


def sft_settings(model, steps: int, batch_size: int, lr: float, seed: int) -> dict[str, Any]:
    """The `sft` settings of a tiny model's fine-tuning (paperflow.promptscale.sft): AdamW at a constant `lr`, no
    weight decay, no gradient clipping, float32, `steps` steps of `batch_size` rows (TRL draws them without
    replacement, epoch by epoch, shuffled by `seed`)."""
    return {
        "learning_rate": float(lr),
        "per_device_train_batch_size": int(batch_size),
        "max_steps": int(steps),
        "max_length": int(model.config.max_position_embeddings),
        "seed": int(seed),
        "lr_scheduler_type": "constant",
        "weight_decay": 0.0,
        "max_grad_norm": 0.0,
        "bf16": False,
        "gradient_checkpointing": False,
        "logging_steps": 1,
    }


def fit(model, tok, pairs, steps: int, batch_size: int, lr: float, rng: np.random.Generator, desc: str) -> list[dict]:
    """Supervised fine-tuning of a tiny model through TRL's SFTTrainer, the trainer of paper scale (`sft.fit`):
    token-mean NLL over the completion (EOS included); TRL's shuffling seed drawn from `rng`. One row per step
    (step, loss)."""
    from paperflow.promptscale import sft

    logged = sft.fit(
        model, tok, sft_rows(tok, pairs), sft_settings(model, steps, batch_size, lr, int(rng.integers(2**31)))
    )
    if len(logged) != steps:
        raise RuntimeError(f"{desc}: TRL logged {len(logged)} steps, expected {steps}")
    return [{"step": int(r["step"]) - 1, "loss": float(r["loss"])} for r in logged]


@contextmanager
def served(model, tok, name: str) -> Iterator[Client]:
    """A kit Client of `model` served by the kit's local OpenAI-compatible server (paperflow.core.lm.local_server)
    for the block: the tiny models sample through the HTTP path paper scale's vLLM servers serve
    (`vllm_server.complete_each`), not through an in-process sampler of their own."""
    with LocalServer(model, tok, name, max_batch_rows=SERVER_BATCH_ROWS) as server:
        yield server.client(concurrency=SERVER_CONCURRENCY, timeout_s=600)


def prompt_text(tok, words: Sequence[str]) -> str:
    """A word prompt as the text the server tokenizes: BOS, then the words (the layout `Encoded.of` and TRL's rows
    use)."""
    return " ".join((tok.bos_token, *words))


def generate(
    model, tok, prompts: Sequence[tuple], max_new_tokens: int, temperature: float, seed: int, n: int = 1
) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """`n` samples per prompt (prompt-major) through the local server's /v1/completions, prompt i with seed
    `seed + i` (as paper scale's `complete_each`): (completion words before EOS, ended with EOS)."""
    with served(model, tok, "tiny") as client:
        samples = complete_each(
            client,
            [prompt_text(tok, p) for p in prompts],
            n=n,
            temperature=float(temperature),
            top_p=1.0,
            max_tokens=int(max_new_tokens),
            seed=int(seed),
        )
    words = [tuple(c["text"].split()) for choices in samples for c in choices]
    ended = np.array([c["finish_reason"] == "stop" for choices in samples for c in choices], bool)
    return words, ended


def greedy(model, tok, prompts: Sequence[tuple], max_new_tokens: int) -> list[tuple[str, ...]]:
    return generate(model, tok, prompts, max_new_tokens, 0.0, 0)[0]
