"""The trajectory analysis of spec sections 7-8 and 11: each turn of held-out episodes scored by a PRM's per-token
turn score S_k / n_k, against the ex-ante usefulness labels (exact Q-values, `env.useful_ex_ante`); the AUROC
(`sklearn.metrics.roc_auc_score`) with a bootstrap interval over episodes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.itpo import env, prm, rewards


@torch.no_grad()
def turn_scores(implicit, ref, episodes: env.Episodes, beta: float) -> list[np.ndarray]:
    """Per episode, S_k / n_k of each of its turns under the PRM `implicit` (r_t = beta * q_t)."""
    ref_logp = sequence_logprobs(ref, episodes.input_ids, episodes.attention_mask)
    r = prm.token_rewards(implicit, ref_logp, episodes.input_ids, episodes.attention_mask, episodes.response_mask, beta)
    t = rewards.turn_stats(r, episodes.response_mask)
    per = (t.sums / t.counts.clamp(min=1)).numpy()
    return [per[i, : len(turns)] for i, turns in enumerate(episodes.turns)]


def turn_frame(episodes: env.Episodes, scores: dict[str, list[np.ndarray]]) -> pd.DataFrame:
    """One row per turn: episode, turn, action, labels, and each named PRM's S_k / n_k."""
    rows = []
    for i, turns in enumerate(episodes.turns):
        for k, turn in enumerate(turns):
            rows.append(
                {
                    "episode": i,
                    "turn": k,
                    "action": turn["action"],
                    "tokens": turn["tokens"],
                    "knows_b": turn["knows_b"],
                    "useful": bool(turn["useful"]),
                    "useful_after_reply": bool(turn["useful_after_reply"]),
                    "q_gain": float(turn["q_gain"]),
                    **{f"score_{name}": float(s[i][k]) for name, s in scores.items()},
                }
            )
    return pd.DataFrame(rows)


def auroc(labels, scores) -> float:
    """AUROC of `scores` at separating True from False labels; NaN when one class is missing."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels, bool)
    if labels.all() or not labels.any():
        return float("nan")
    return float(roc_auc_score(labels, np.asarray(scores, float)))


def bootstrap_aurocs(frame: pd.DataFrame, label: str, score: str, reps: int, seed: int) -> np.ndarray:
    """AUROCs over `reps` resamples of the episodes with replacement (a resampled episode brings all its turns:
    each turn weighted by its episode's count in the resample)."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    codes, episode = np.unique(frame["episode"].to_numpy(), return_inverse=True)
    y, x = frame[label].to_numpy(bool), frame[score].to_numpy(float)
    out = []
    for _ in range(reps):
        w = np.bincount(rng.integers(0, len(codes), len(codes)), minlength=len(codes))[episode]
        keep = w > 0
        if y[keep].all() or not y[keep].any():
            out.append(float("nan"))
            continue
        out.append(float(roc_auc_score(y[keep], x[keep], sample_weight=w[keep])))
    return np.asarray(out)
