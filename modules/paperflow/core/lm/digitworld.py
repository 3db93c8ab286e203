"""Digit world: the synthetic, verifiable token tasks the language-model papers share at tiny/smoke scale
(EAPO's addition, ConFu's sort and key-value plan, counting). LOZO+, ITPO and PromptScale define vocabularies of
their own in their specs; they share the kit's word-level tokenizer, whose four special tokens take ids 0-3 (a
spec's fixed token ids shift by four, and its vocabulary size grows by the specials it did not count).

Every task writes a prompt and an answer as lists of words; the answer is a function of the prompt,
so a completion is checked exactly. Each draw takes its own `numpy.random.Generator`: two methods
compared in one job see the same prompts when they draw from generators with the same seed.

    world = DigitWorld.from_config({"addition": {"n_digits": 2}})
    tok = world.tokenizer()                      # 16 tokens: <pad> <bos> <eos> <unk> 0-9 + =
    test = world.held_out("addition", 500, seed=12345)
    batch = world.sample("addition", 16, np.random.default_rng(0), exclude=test)
    ids = world.encode(tok, batch)               # id tensors: left-padded prompts, gold answers + EOS
    rewards = ids.rewards(completion_ids)        # DigitWorld.reward for a whole batch of sampled ids
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paperflow.core.config import ConfigError, reject_unknown, require_keys
from paperflow.core.lm.tokenizer import DEFAULT_SPECIALS, word_level_tokenizer

DIGITS = tuple(str(d) for d in range(10))


@dataclass(frozen=True)
class Example:
    """One task instance: `prompt` and `answer` are word tuples (no BOS/EOS; `encode_*` adds them)."""

    task: str
    prompt: tuple[str, ...]
    answer: tuple[str, ...]


def _digits(value: int, width: int) -> tuple[str, ...]:
    return tuple(f"{value:0{width}d}")


@dataclass(frozen=True)
class Addition:
    """'a a + b b =' -> the sum in n_digits + 1 zero-padded digits (EAPO's smoke task)."""

    n_digits: int

    name = "addition"
    words = (*DIGITS, "+", "=")

    def draw(self, rng: np.random.Generator) -> Example:
        a, b = (int(x) for x in rng.integers(0, 10**self.n_digits, size=2))
        prompt = (*_digits(a, self.n_digits), "+", *_digits(b, self.n_digits), "=")
        return Example(self.name, prompt, _digits(a + b, self.n_digits + 1))


@dataclass(frozen=True)
class Sorting:
    """'sort d d ... d =' (min_len..max_len digits) -> the digits in ascending order (ConFu's task S)."""

    min_len: int
    max_len: int

    name = "sorting"
    words = ("sort", *DIGITS, "=")

    def draw(self, rng: np.random.Generator) -> Example:
        n = int(rng.integers(self.min_len, self.max_len + 1))
        values = rng.integers(0, 10, size=n)
        return Example(self.name, ("sort", *map(str, values), "="), tuple(map(str, np.sort(values))))


@dataclass(frozen=True)
class KeyValue:
    """'k : v ; ... order k k ... =' with n_pairs distinct digit keys -> their values in the asked order
    (ConFu's key-value plan: the answer's content is chosen far back in the prompt)."""

    n_pairs: int
    n_queries: int

    name = "key_value"
    words = (*DIGITS, ":", ";", "order", "=")

    def draw(self, rng: np.random.Generator) -> Example:
        keys = rng.choice(10, size=self.n_pairs, replace=False)
        values = rng.integers(0, 10, size=self.n_pairs)
        asked = rng.choice(self.n_pairs, size=self.n_queries, replace=False)
        pairs = [w for k, v in zip(keys, values) for w in (str(k), ":", str(v), ";")]
        prompt = (*pairs, "order", *(str(keys[i]) for i in asked), "=")
        return Example(self.name, prompt, tuple(str(values[i]) for i in asked))


@dataclass(frozen=True)
class Counting:
    """'count x in d d ... d =' -> how often digit x occurs, in 2 digits."""

    min_len: int
    max_len: int

    name = "counting"
    words = ("count", "in", *DIGITS, "=")

    def draw(self, rng: np.random.Generator) -> Example:
        n = int(rng.integers(self.min_len, self.max_len + 1))
        values = rng.integers(0, 10, size=n)
        target = int(rng.integers(0, 10))
        prompt = ("count", str(target), "in", *map(str, values), "=")
        return Example(self.name, prompt, _digits(int((values == target).sum()), 2))


@dataclass
class EncodedBatch:
    """Examples as id tensors for sampling, SFT and rewards: `prompt_ids` [B, P] left-padded with BOS first
    (`prompt_mask` 1 on real tokens, the kit sampler's convention), `answer_ids` [B, A] the gold answer then EOS,
    right-padded (`answer_mask`). Tasks of fixed lengths (addition) have no padding at all."""

    prompt_ids: Any
    prompt_mask: Any
    answer_ids: Any
    answer_mask: Any
    pad_token_id: int

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def repeat(self, group_size: int) -> EncodedBatch:
        """Each example `group_size` times in a row: rows [0, G) are example 0's (the kit's group layout)."""
        return self._map(lambda t: t.repeat_interleave(group_size, 0))

    def tile(self, times: int) -> EncodedBatch:
        """The whole batch `times` times over (rows [0, B) again and again)."""
        return self._map(lambda t: t.repeat(times, 1))

    def _map(self, fn) -> EncodedBatch:
        return EncodedBatch(
            fn(self.prompt_ids), fn(self.prompt_mask), fn(self.answer_ids), fn(self.answer_mask), self.pad_token_id
        )

    def rewards(self, completion_ids):
        """`DigitWorld.reward` per row from sampled ids [B, T]: 1.0 iff the first tokens are the gold answer and
        EOS (what follows EOS is ignored; a completion shorter than the answer scores 0)."""
        import torch

        width = self.answer_ids.shape[1]
        got = completion_ids[:, :width]
        if got.shape[1] < width:
            fill = torch.full((got.shape[0], width - got.shape[1]), -1, dtype=got.dtype, device=got.device)
            got = torch.cat([got, fill], 1)
        ok = (got == self.answer_ids) | ~self.answer_mask.bool()
        return ok.all(1).float()

    def sft(self) -> dict[str, Any]:
        """Prompt + answer as one left-padded sequence with `completion_mask` on the answer (EOS included): the
        inputs of `sampling.sequence_logprobs` for a supervised loss. Rows keep their padding on the left."""
        import torch

        lengths = self.answer_mask.sum(1)
        rows, comp = [], []
        for p, pm, a, n in zip(self.prompt_ids, self.prompt_mask, self.answer_ids, lengths):
            real = p[pm.bool()]
            rows.append(torch.cat([real, a[: int(n)]]))
            comp.append(int(n))
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        cmask = torch.zeros_like(ids)
        for i, (r, n) in enumerate(zip(rows, comp)):
            ids[i, width - len(r) :] = r
            attn[i, width - len(r) :] = 1
            cmask[i, width - n :] = 1
        return {"input_ids": ids, "attention_mask": attn, "completion_mask": cmask}


TASKS = {cls.name: cls for cls in (Addition, Sorting, KeyValue, Counting)}
TASK_KEYS = {
    "addition": ("n_digits",),
    "sorting": ("min_len", "max_len"),
    "key_value": ("n_pairs", "n_queries"),
    "counting": ("min_len", "max_len"),
}


def make_task(name: str, params: Mapping[str, Any]):
    """The task `name` with exactly its parameters (a missing or unknown key is named)."""
    if name not in TASKS:
        raise ConfigError(f"unknown digit-world task {name!r}; known: {', '.join(TASKS)}")
    where = f"digit-world task {name!r}"
    require_keys(params, TASK_KEYS[name], where)
    reject_unknown(params, TASK_KEYS[name], where)
    task = TASKS[name](**{k: int(params[k]) for k in TASK_KEYS[name]})
    if name in ("sorting", "counting") and not 1 <= task.min_len <= task.max_len:
        raise ConfigError(f"{where}: need 1 <= min_len <= max_len, got {task.min_len}, {task.max_len}")
    if name == "key_value" and not 1 <= task.n_queries <= task.n_pairs <= 10:
        raise ConfigError(f"{where}: need 1 <= n_queries <= n_pairs <= 10, got {task.n_queries}, {task.n_pairs}")
    return task


class DigitWorld:
    """A set of digit-world tasks with one vocabulary: the special tokens, then the tasks' words in the
    order the tasks are given (so a world of addition alone is EAPO's 16-token vocabulary)."""

    def __init__(self, tasks: Sequence[Any], specials: Mapping[str, str] = DEFAULT_SPECIALS):
        if not tasks:
            raise ConfigError("a digit world needs at least one task")
        self.tasks = {t.name: t for t in tasks}
        self.specials = dict(specials)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Mapping[str, Any]]) -> DigitWorld:
        """{task name: its parameters}, e.g. {"addition": {"n_digits": 2}}."""
        return cls([make_task(name, params) for name, params in cfg.items()])

    @property
    def words(self) -> list[str]:
        seen: dict[str, None] = {}
        for task in self.tasks.values():
            seen.update(dict.fromkeys(task.words))
        return list(seen)

    def tokenizer(self, chat_template: str | None = None):
        return word_level_tokenizer(self.words, self.specials, chat_template=chat_template)

    def task(self, name: str):
        if name not in self.tasks:
            raise ConfigError(f"task {name!r} is not in this digit world; it has: {', '.join(self.tasks)}")
        return self.tasks[name]

    def sample(
        self, name: str, n: int, rng: np.random.Generator, exclude: Iterable[Example] = (), max_tries: int = 100
    ) -> list[Example]:
        """`n` draws of task `name` from `rng`, redrawing any prompt found in `exclude` (a held-out set)."""
        task = self.task(name)
        banned = {ex.prompt for ex in exclude}
        out = []
        for _ in range(n):
            for _ in range(max_tries):
                ex = task.draw(rng)
                if ex.prompt not in banned:
                    break
            else:
                raise RuntimeError(f"{name}: {max_tries} draws in a row fell in the excluded set; shrink it")
            out.append(ex)
        return out

    def held_out(self, name: str, n: int, seed: int) -> list[Example]:
        """`n` distinct prompts of task `name` from their own generator (seed), e.g. a fixed test set."""
        task = self.task(name)
        rng = np.random.default_rng(seed)
        found: dict[tuple[str, ...], Example] = {}
        for _ in range(100 * n):
            ex = task.draw(rng)
            found.setdefault(ex.prompt, ex)
            if len(found) == n:
                return list(found.values())
        raise ValueError(f"{name}: could not draw {n} distinct prompts (the task has fewer)")

    def encode(self, tokenizer, examples: Sequence[Example]) -> EncodedBatch:
        """`examples` as id tensors (`EncodedBatch`) with `tokenizer` (this world's `tokenizer()`); a word outside
        its vocabulary is refused."""
        import torch

        from paperflow.core.lm.tokenizer import encode_words

        if not examples:
            raise ValueError("encode needs at least one example")
        prompts = encode_words(tokenizer, [ex.prompt for ex in examples], add_bos=True)
        vocab = tokenizer.get_vocab()
        missing = sorted({w for ex in examples for w in ex.answer if w not in vocab})
        if missing:
            raise ValueError(f"answer words outside the vocabulary: {missing}")
        answers = [[vocab[w] for w in ex.answer] + [tokenizer.eos_token_id] for ex in examples]
        width = max(len(a) for a in answers)
        answer_ids = torch.full((len(answers), width), tokenizer.pad_token_id, dtype=torch.long)
        answer_mask = torch.zeros_like(answer_ids)
        for i, a in enumerate(answers):
            answer_ids[i, : len(a)] = torch.tensor(a)
            answer_mask[i, : len(a)] = 1
        return EncodedBatch(
            prompts["input_ids"], prompts["attention_mask"], answer_ids, answer_mask, tokenizer.pad_token_id
        )

    def reward(self, example: Example, completion: Sequence[str]) -> float:
        """1.0 iff the completion is exactly the answer followed by EOS (anything after EOS is ignored)."""
        eos = self.specials["eos"]
        want = (*example.answer, eos)
        return float(tuple(completion[: len(want)]) == want)
