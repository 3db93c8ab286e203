"""Noisy sequence generation (spec section 4): torchgfn's append-only `BitSequence` (the TB paper's bit
sequences: words of `word_size` bits appended one at a time, log R(x) = -d(x) / temperature with d the
Hamming distance of x to the nearest of `n_modes` reference sequences), observed through the log-space
reward noise of `envs.observed_log_reward`. Metrics of spec section 8 for sequences: reference modes
found within a Hamming distance, top-k mean reward and top-k diversity (mean pairwise Hamming distance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
from gfn.gym import BitSequence
from gfn.preprocessors import Preprocessor


def make_bitseq(spec: Mapping[str, Any], device: str | torch.device = "cpu") -> BitSequence:
    """torchgfn's BitSequence; its reference modes are drawn by torchgfn from `mode_seed`."""
    if spec["seq_size"] % spec["word_size"]:
        raise ValueError(f"seq_size {spec['seq_size']} is not a multiple of word_size {spec['word_size']}")
    return BitSequence(
        word_size=int(spec["word_size"]),
        seq_size=int(spec["seq_size"]),
        n_modes=int(spec["n_modes"]),
        temperature=float(spec["temperature"]),
        seed=int(spec["mode_seed"]),
        device_str=str(device),
    )


def fourier_features(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """[sin(2 pi k t / T_max), cos(2 pi k t / T_max)], k = 1..K, for `freqs` = 2 pi k / T_max (spec 2.1)."""
    angles = t.to(torch.float32)[..., None] * freqs.to(t.device)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def time_frequencies(n_frequencies: int, t_max: int) -> torch.Tensor:
    return torch.arange(1, n_frequencies + 1, dtype=torch.float32) * (2 * math.pi / t_max)


class WordOneHotPreprocessor(Preprocessor):
    """One-hot code of each word slot of a BitSequence state (value -1 = empty slot, 2^k = the sink's
    padding), concatenated with Fourier features of t = the number of words written (spec 2.1 [R])."""

    def __init__(self, words_per_seq: int, word_size: int, n_frequencies: int) -> None:
        self.n_values = 2**word_size + 2
        super().__init__(output_dim=words_per_seq * self.n_values + 2 * n_frequencies)
        self.freqs = time_frequencies(n_frequencies, words_per_seq + 1) if n_frequencies else None

    def preprocess(self, states) -> torch.Tensor:
        one_hot = torch.nn.functional.one_hot(states.tensor + 1, self.n_values).flatten(-2).to(torch.float32)
        if self.freqs is None:
            return one_hot
        return torch.cat([one_hot, fourier_features(states.length, self.freqs)], dim=-1)


def words_to_bits(words: np.ndarray, word_size: int) -> np.ndarray:
    """(n, words) integer words -> (n, words * word_size) bits, most significant bit first (torchgfn's order)."""
    shifts = np.arange(word_size - 1, -1, -1)
    return ((np.asarray(words, dtype=np.int64)[..., None] >> shifts) & 1).reshape(len(words), -1).astype(np.int8)


def reference_modes(env: BitSequence) -> pd.DataFrame:
    """torchgfn's reference sequences as bit columns b0..b{n-1}, one row per mode."""
    bits = env.modes.cpu().numpy().astype(np.int8)
    return pd.DataFrame(bits, columns=[f"b{j}" for j in range(bits.shape[1])])


def distance_to_modes(bits: np.ndarray, modes: np.ndarray) -> np.ndarray:
    """(n, n_modes) Hamming distances between sequences and reference modes."""
    return (bits[:, None, :] != modes[None, :, :]).sum(-1)


def modes_found(bits: np.ndarray, modes: np.ndarray, within: int) -> int:
    """Number of reference modes with at least one sequence within Hamming distance `within` (TB paper's count)."""
    if len(bits) == 0:
        return 0
    return int((distance_to_modes(bits, modes) <= within).any(axis=0).sum())


def top_k(bits: np.ndarray, modes: np.ndarray, temperature: float, k: int) -> tuple[float, float]:
    """(mean true reward, mean pairwise Hamming distance) of the k highest-reward distinct sequences."""
    distinct = np.unique(bits, axis=0)
    reward = np.exp(-distance_to_modes(distinct, modes).min(axis=1) / temperature)
    order = np.argsort(-reward, kind="stable")[:k]
    best = distinct[order]
    if len(best) < 2:
        return float(reward[order].mean()), float("nan")
    pairwise = (best[:, None, :] != best[None, :, :]).sum(-1)
    return float(reward[order].mean()), float(pairwise[np.triu_indices(len(best), 1)].mean())


def sequence_metrics(
    words: np.ndarray, modes: np.ndarray, spec: Mapping[str, Any], cfg: Mapping[str, Any]
) -> dict[str, float]:
    """Spec 8 for sequences, on visited terminal sequences given as (n, words_per_seq) words."""
    bits = words_to_bits(words, int(spec["word_size"]))
    reward, diversity = top_k(bits, modes, float(spec["temperature"]), int(cfg["top_k"]))
    return {
        "modes_found": float(modes_found(bits, modes, int(spec["mode_distance"]))),
        "modes_total": float(len(modes)),
        "topk_reward": reward,
        "topk_diversity": diversity,
    }
