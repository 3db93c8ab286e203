"""SynthConvQA (spec section 4): a seeded conversational retrieval world that keeps DualReform's phenomenon.

Passages are (entity, aspect) cells: the entity's two pseudo-word name, the aspect word, `values_per_passage`
value words drawn from the aspect's small vocabulary (so passages of one aspect share most of their values)
and filler. A conversation moves between entities (switch probability per turn); the first turn about an
entity names it, later turns are elliptic ("and its founding"). The response of a turn holds
`response_values` of the gold passage's value words plus noise words, and names the entity with probability
`p_entity_in_response`: without the conversation's entity a response retrieves same-aspect passages of other
entities as well as the gold one, which is what refinement with the context has to fix.

Everything is drawn from one `numpy.random.Generator` seeded by the world seed, in a fixed order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import reject_unknown, require_keys

# a human-template rewrite resolves the ellipsis, as QReCC's human rewrites do: an elliptic query gets the
# conversation's current entity, a query that names its entity is kept
ASPECTS = ("founding", "location", "products", "leader", "history", "awards")
QUERY_WORDS = ("what", "about", "and", "its", "tell", "me")
WORLD_KEYS = (
    "n_entities",
    "values_per_aspect",
    "values_per_passage",
    "filler_vocab",
    "filler_per_passage",
    "n_train",
    "n_test",
    "min_turns",
    "max_turns",
    "p_switch",
    "response_values",
    "response_noise",
    "p_entity_in_response",
)
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class World:
    """The corpus and the conversations of one world seed."""

    passages: pd.DataFrame  # pid, entity, aspect, text
    turns: pd.DataFrame  # split, conv, turn, entity, aspect, query, response, human_rewrite, gold_pid
    entities: list[str]  # entity names ("w1 w2"), index = entity id
    aspect_values: dict[str, list[str]]


def _pseudo_words(n: int, rng: np.random.Generator, taken: set[str], syllables: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        word = "".join(rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS)) for _ in range(syllables))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def generate(cfg: Mapping[str, Any], seed: int) -> World:
    """The world of `seed` under the sizes in `cfg` (every key of WORLD_KEYS, nothing else)."""
    require_keys(cfg, WORLD_KEYS, "dualreform world")
    reject_unknown(cfg, WORLD_KEYS, "dualreform world")
    if cfg["values_per_passage"] > cfg["values_per_aspect"] or cfg["response_values"] > cfg["values_per_passage"]:
        raise ValueError("need response_values <= values_per_passage <= values_per_aspect")
    rng = np.random.default_rng(seed)
    taken = set(ASPECTS) | set(QUERY_WORDS)
    names = _pseudo_words(2 * cfg["n_entities"], rng, taken, syllables=3)
    entities = [f"{names[2 * i]} {names[2 * i + 1]}" for i in range(cfg["n_entities"])]
    aspect_values = {a: _pseudo_words(cfg["values_per_aspect"], rng, taken, syllables=2) for a in ASPECTS}
    filler = _pseudo_words(cfg["filler_vocab"], rng, taken, syllables=1)

    rows = []
    passage_values: dict[tuple[int, str], list[str]] = {}
    for e, name in enumerate(entities):
        for a in ASPECTS:
            values = list(rng.choice(aspect_values[a], size=cfg["values_per_passage"], replace=False))
            passage_values[(e, a)] = values
            words = [*values, *rng.choice(filler, size=cfg["filler_per_passage"])]
            rng.shuffle(words)
            rows.append({"pid": len(rows), "entity": e, "aspect": a, "text": " ".join([name, a, *words])})
    passages = pd.DataFrame(rows)
    pid_of = {(r.entity, r.aspect): r.pid for r in passages.itertuples()}

    noise_pool = [v for a in ASPECTS for v in aspect_values[a]]
    turns = []
    for split, n_conv in (("train", cfg["n_train"]), ("test", cfg["n_test"])):
        for c in range(n_conv):
            conv = f"{split}{c}"
            entity = int(rng.integers(cfg["n_entities"]))
            n_turns = int(rng.integers(cfg["min_turns"], cfg["max_turns"] + 1))
            for t in range(n_turns):
                named = t == 0
                if t > 0 and rng.random() < cfg["p_switch"]:
                    entity = int((entity + rng.integers(1, cfg["n_entities"])) % cfg["n_entities"])
                    named = True
                aspect = str(rng.choice(ASPECTS))
                name = entities[entity]
                query = f"what about {name} {aspect}" if named else f"and its {aspect}"
                values = list(rng.choice(passage_values[(entity, aspect)], size=cfg["response_values"], replace=False))
                noise = list(rng.choice(noise_pool, size=cfg["response_noise"], replace=False))
                words = values + noise
                rng.shuffle(words)
                if rng.random() < cfg["p_entity_in_response"]:
                    words = [*name.split(), *words]
                turns.append(
                    {
                        "split": split,
                        "conv": conv,
                        "turn": t,
                        "entity": entity,
                        "aspect": aspect,
                        "query": query,
                        "response": " ".join(words),
                        "human_rewrite": query if named else f"{query} {name}",
                        "gold_pid": pid_of[(entity, aspect)],
                    }
                )
    return World(passages, pd.DataFrame(turns), entities, aspect_values)
