"""The theory-of-mind belief over the user's need: an exact Bayes filter with the agent's estimated feedback
likelihood, its entropy, and the expected information gain of a candidate strategy (spec section 2.3).

    b = uniform(n)                                   # [n, Z]
    b = update(b, L_agent, strategy, feedback)       # b'(z) ∝ b(z) L[z, s, u]
    gain = eig(b, L_agent)                           # [n, S]: H(b) - E_u[H(b | s, u)]

Entropies are in nats, so a perfectly informative candidate under a (0.5, 0.5) belief gains ln 2.
"""

from __future__ import annotations

import numpy as np


def uniform(n: int, hypotheses: int) -> np.ndarray:
    return np.full((n, hypotheses), 1.0 / hypotheses)


def entropy(p: np.ndarray) -> np.ndarray:
    """-sum p log p over the last axis (0 log 0 = 0)."""
    p = np.asarray(p, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    return -terms.sum(axis=-1)


def update(belief: np.ndarray, likelihood: np.ndarray, strategy, feedback) -> np.ndarray:
    """b'(z) ∝ b(z) L[z, s, u] row by row (belief [n, Z], strategy and feedback [n])."""
    like = likelihood[:, np.asarray(strategy), np.asarray(feedback)].T  # [n, Z]
    post = belief * like
    total = post.sum(axis=1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError("a feedback has zero likelihood under every hypothesis of the belief")
    return post / total


def eig(belief: np.ndarray, likelihood: np.ndarray) -> np.ndarray:
    """Expected information gain of every strategy, [n, S]: H(b) - sum_u p(u | s) H(b(. | s, u)) with
    p(u | s) = sum_z b(z) L[z, s, u]."""
    joint = belief[:, :, None, None] * likelihood[None]  # [n, Z, S, U]
    marginal = joint.sum(axis=1)  # [n, S, U]
    with np.errstate(divide="ignore", invalid="ignore"):
        post = np.where(marginal[:, None] > 0, joint / marginal[:, None], 0.0)  # [n, Z, S, U]
    h_post = entropy(np.moveaxis(post, 1, -1))  # [n, S, U]
    return entropy(belief)[:, None] - (marginal * h_post).sum(axis=-1)


def feedback_counts(need, strategy, feedback, shape: tuple[int, int, int]) -> np.ndarray:
    """n[z, s, u]: how often a user of need z answered strategy s with feedback u in a labelled corpus."""
    counts = np.zeros(shape)
    np.add.at(counts, (np.asarray(need), np.asarray(strategy), np.asarray(feedback)), 1.0)
    return counts


def estimate_likelihood(counts: np.ndarray, prior: float) -> np.ndarray:
    """The agent's ToM likelihood from counts with a symmetric Dirichlet prior (the posterior mean):
    L~[z, s, u] = (n[z, s, u] + prior) / (n[z, s] + U prior). A cell with no data is uniform; with many it
    converges to the observed frequencies. The smoke scale counts a labelled corpus, the paper scale the LLM's
    answers (prior 1: add-one)."""
    counts = np.asarray(counts, float)
    if prior <= 0 or np.any(counts < 0):
        raise ValueError(f"estimate_likelihood: prior {prior} must be > 0 and counts >= 0")
    return (counts + prior) / (counts.sum(axis=-1, keepdims=True) + counts.shape[-1] * prior)
