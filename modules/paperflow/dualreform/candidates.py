"""The synthetic teacher standing in for the LLM that writes the SFT data (spec section 7): its rewrites of the
queries and refinements of the responses, which err at a configured rate. The preference candidates are not the
teacher's: the CQR model samples them (paperflow.dualreform.writer).

The teacher reads entity names off the history text as an LLM would (it knows the entity lexicon, not which
entity a turn is about): "previous" is the entity mentioned last, "first" the one mentioned first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mentioned_entities(
    history: Sequence[tuple[str, str]], lexicon: dict[tuple[str, str], str]
) -> tuple[list[str], str | None]:
    """The entity names of the history's queries and responses in order of first mention, and the name
    mentioned last (None when no name occurs). `lexicon` maps a name's two words to the name."""
    order: dict[str, None] = {}
    last = None
    for query, response in history:
        for text in (query, response):
            words = text.split()
            for pair in zip(words, words[1:]):
                name = lexicon.get(pair)
                if name is not None:
                    order.setdefault(name)
                    last = name
    return list(order), last


TEACHER_ERRORS = ("drop", "swap")  # an erring teacher drops the entity or names a wrong one (equally often)


def teacher_rewrite(
    text: str,
    history: Sequence[tuple[str, str]],
    lexicon: dict[tuple[str, str], str],
    entities: Sequence[str],
    error_rate: float,
    rng: np.random.Generator,
) -> tuple[str, str]:
    """The synthetic teacher's rewrite of `text` (a query, or a response with the current query closing its
    history) and its error ("" when right, else one of TEACHER_ERRORS).

    The teacher reads the conversation, never the gold passage: the entity is the one `text` names, else the one
    the history mentions last; a right rewrite keeps a text that names it and appends it otherwise. With
    probability `error_rate` it errs: "drop" leaves the entity out (the name removed, nothing appended), "swap"
    names a wrong one instead (another entity of the history when there is one, else any other entity)."""
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"teacher_error_rate must be in [0, 1], got {error_rate}")
    own, _ = mentioned_entities([(text, "")], lexicon)
    names, last = mentioned_entities(history, lexicon)
    entity = own[-1] if own else last
    if rng.random() >= error_rate or entity is None:
        return (text if own else f"{text} {entity or ''}".strip()), ""
    name_words = set(entity.split())
    bare = " ".join(w for w in text.split() if w not in name_words)
    if rng.random() < 0.5:
        return bare, "drop"
    others = [n for n in names if n != entity] or [n for n in entities if n != entity]
    return f"{bare} {others[rng.integers(len(others))]}", "swap"
