"""The tiny CQR model's tokenizer and prompts (spec section 7), in its two roles.

One causal LM rewrites the current utterance of a conversation into a self-contained one:
`<bos> <hist> q_1 ... q_{t-1} <cur> x <rew>` -> the rewrite of x, then `<eos>`. In the rewrite role x is the query
q_t; in the refine role (the dual role, spec section 11) x is the response r_t and the history ends with q_t. The
history holds the queries; the responses are left out to keep sequences short at smoke scale (every entity a
response names was named by a query first).

The model writes (paperflow.dualreform.writer) and is trained by TRL (paperflow.dualreform.lora.train_sft /
train_dpo), as at paper scale.
"""

from __future__ import annotations

from collections.abc import Sequence

from paperflow.core.lm.tokenizer import DEFAULT_SPECIALS, word_level_tokenizer

MARKERS = ("<hist>", "<cur>", "<rew>")


def make_tokenizer(words: Sequence[str]):
    """The word-level tokenizer over the world's words and the prompt markers."""
    return word_level_tokenizer([*MARKERS, *words])


def rewrite_prompt(history_queries: Sequence[str], query: str) -> list[str]:
    return ["<hist>", *" ".join(history_queries).split(), "<cur>", *query.split(), "<rew>"]


def refine_prompt(history_queries: Sequence[str], query: str, response: str) -> list[str]:
    return rewrite_prompt([*history_queries, query], response)


def prompt_text(words: Sequence[str]) -> str:
    """A prompt's words as the text TRL and the writer tokenize: BOS first, a space last (TRL joins prompt and
    completion strings)."""
    return " ".join((DEFAULT_SPECIALS["bos"], *words)) + " "
