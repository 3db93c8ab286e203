"""The two knowledge memories and their retrieval by sentence embedding (spec sections 2.2 and 2.3).

PRINCIPLES-like: principles "when <situation>, use <strategy>, rather than <failed strategies>", retrieved by the
situation's embedding (top-k by cosine, the L2 order of unit vectors). UKA: knowledge entries (situation, inferred
need, strategy, critic reward), retrieved per need hypothesis by the embedding of "<situation> <need>"; the
predicted reward of (strategy, need) is the mean reward of the k nearest entries of that strategy.

Embeddings: every situation text and every (situation, need) text is embedded once by the preprocess stage
(MiniLM through `paperflow.core.lm.encoders`, or the hashed bag-of-words fallback) and looked up by row here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from paperflow.uka import needworld as nw

HASH_DIM = 256


def hashed_embedding(texts: list[str], dim: int = HASH_DIM) -> np.ndarray:
    """The fallback encoder (spec section 7): a bag of lowercased words hashed (blake2b) into `dim` buckets,
    L2-normalised. Same interface as MiniLM's vectors: one unit row per text."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().replace(".", " ").replace(",", " ").split():
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            out[i, h % dim] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


@dataclass(frozen=True)
class Embeddings:
    """Unit vectors of every situation text ([450, D]) and every (situation, need) text ([1800, D])."""

    situation: np.ndarray
    keyed: np.ndarray

    @staticmethod
    def from_frame(frame: pd.DataFrame) -> Embeddings:
        """From the preprocess table (columns kind, row, vector); checks the rows against the NeedWorld texts."""
        parts = {}
        for kind, texts in (("situation", nw.situation_texts()), ("keyed", nw.keyed_texts())):
            sub = frame[frame["kind"] == kind].sort_values("row")
            if list(sub["text"]) != texts:
                raise ValueError(
                    f"the {kind} embeddings do not match needworld's texts ({nw.VERSION}); rerun preprocess"
                )
            parts[kind] = np.stack(sub["vector"].to_numpy()).astype(np.float32)
        return Embeddings(**parts)


def top_k_mask(sims: np.ndarray, k: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of the k largest entries along the last axis (ties by lower index), among `valid` ones."""
    s = np.where(valid, sims, -np.inf) if valid is not None else sims
    order = np.argsort(-s, axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(s.shape[-1])[(None,) * (s.ndim - 1)], axis=-1)
    return (rank < k) & np.isfinite(s)


@dataclass
class PrincipleMemory:
    """PRINCIPLES-like memory: one row per principle (situation row, recommended strategy, failed-strategy mask)."""

    situation: list[int] = field(default_factory=list)
    strategy: list[int] = field(default_factory=list)
    rather: list[int] = field(default_factory=list)  # bit s set: "rather than strategy s"

    def __len__(self) -> int:
        return len(self.situation)

    def add(self, situation: int, strategy: int, failed: list[int]) -> None:
        self.situation.append(int(situation))
        self.strategy.append(int(strategy))
        self.rather.append(sum(1 << int(f) for f in set(failed)))

    def votes(self, emb: Embeddings, query: np.ndarray, k: int) -> np.ndarray:
        """[n, S]: sum over the top-k principles of cos(query, situation) for the recommended strategy, minus it for
        each strategy the principle advises against."""
        n = len(query)
        out = np.zeros((n, len(nw.STRATEGIES)))
        if not len(self):
            return out
        sims = emb.situation[query] @ emb.situation[np.asarray(self.situation)].T  # [n, E]
        chosen = top_k_mask(sims, k) * sims
        rec = np.eye(len(nw.STRATEGIES))[np.asarray(self.strategy)]  # [E, S]
        bits = (np.asarray(self.rather)[:, None] >> np.arange(len(nw.STRATEGIES))) & 1  # [E, S]
        return chosen @ rec - chosen @ bits

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "kind": "principle",
                "situation": self.situation,
                "strategy": self.strategy,
                "rather": self.rather,
                "need": -1,
                "reward": np.nan,
            }
        )


@dataclass
class KnowledgeMemory:
    """UKA's memory: one row per entry (situation row, inferred need, strategy, critic reward)."""

    situation: list[int] = field(default_factory=list)
    need: list[int] = field(default_factory=list)
    strategy: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.situation)

    def add(self, situation: int, need: int, strategy: int, reward: float) -> None:
        self.situation.append(int(situation))
        self.need.append(int(need))
        self.strategy.append(int(strategy))
        self.reward.append(float(reward))

    def predicted(self, emb: Embeddings, query: np.ndarray, k: int, unknown: float) -> np.ndarray:
        """[n, Z, S]: for each need hypothesis z, the mean reward of the k entries of strategy s nearest to
        "<situation> <need z>" (cosine of the keyed texts); `unknown` where the memory has no entry of s."""
        n, Z, S = len(query), len(nw.NEEDS), len(nw.STRATEGIES)
        if not len(self):
            return np.full((n, Z, S), unknown)
        keys = np.asarray(self.situation) * Z + np.asarray(self.need)
        q = np.asarray(query)[:, None] * Z + np.arange(Z)[None]  # [n, Z]
        sims = emb.keyed[q] @ emb.keyed[keys].T  # [n, Z, E]
        of = np.asarray(self.strategy)[None, :] == np.arange(S)[:, None]  # [S, E]
        mask = top_k_mask(np.broadcast_to(sims[:, :, None, :], (n, Z, S, len(self))), k, of[None, None])
        count = mask.sum(axis=-1)
        total = (mask * np.asarray(self.reward)).sum(axis=-1)
        return np.where(count > 0, total / np.maximum(count, 1), unknown)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "kind": "knowledge",
                "situation": self.situation,
                "strategy": self.strategy,
                "rather": 0,
                "need": self.need,
                "reward": self.reward,
            }
        )


def memory_from_frame(frame: pd.DataFrame) -> PrincipleMemory | KnowledgeMemory | None:
    """The memory a training stage wrote (None for an empty frame of a memory-less method)."""
    kinds = set(frame["kind"])
    if not kinds:
        return None
    if kinds == {"principle"}:
        return PrincipleMemory(
            list(map(int, frame["situation"])), list(map(int, frame["strategy"])), list(map(int, frame["rather"]))
        )
    if kinds == {"knowledge"}:
        return KnowledgeMemory(
            list(map(int, frame["situation"])),
            list(map(int, frame["need"])),
            list(map(int, frame["strategy"])),
            list(map(float, frame["reward"])),
        )
    raise ValueError(f"a memory table mixes kinds {sorted(kinds)}")
