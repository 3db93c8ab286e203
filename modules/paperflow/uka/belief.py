"""The theory-of-mind belief over the user's need: an exact Bayes filter with the agent's (approximate) feedback
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


def approximate_likelihood(likelihood: np.ndarray, rng: np.random.Generator, alpha: float) -> np.ndarray:
    """The agent's L~ = normalise(L + Dirichlet(alpha, ..., alpha) noise), one draw per (need, strategy) row
    (spec section 7); alpha = inf returns L itself."""
    if np.isinf(alpha):
        return likelihood.copy()
    noise = rng.dirichlet(np.full(likelihood.shape[-1], alpha), size=likelihood.shape[:-1])
    raw = likelihood + noise
    return raw / raw.sum(axis=-1, keepdims=True)


def permute_needs(likelihood: np.ndarray, shift: int = 1) -> np.ndarray:
    """The likelihood of need z read as that of need z + shift (a ToM model that confuses every need with
    another): the permuted-ToM control."""
    return np.roll(likelihood, shift, axis=0)
