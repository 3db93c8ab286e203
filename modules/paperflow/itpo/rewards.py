"""ITPO's turn-level rewards and RLOO advantages, with the semantics of the official recipe (Graph-COM/ITPO,
`recipe/itpo/itpo_core_algos.py`; spec sections 2.2-2.4 and 9), as pure torch functions over padded [N, L] tensors.

- Turns are the maximal runs of 1s in `response_mask`; a turn's reward sits on its last token.
- PRM token scores are "batch-normed" first: r / (max over the batch of |reverse-cumsum(r)| + 1e-6).
- ITPO: R_k = S_k, the turn's score sum. ITPO-norm: w_k = softmax_k((S_k / n_k) * n_bar / T), n_bar the mean
  turn length over every turn of the batch, and R_k = s * w_k (sum over turns = the outcome).
- PRIME (the token-level baseline): the dense r_t stream, plus the outcome at the last token with reward_gt_coef as
  PRIME's recipe runs it (spec section 2.4: the outcome stream is 0 only in the ITPO runs).
- The length cost is split over turns in proportion n_k / sum_j n_j (its own stream for ITPO and PRIME, added
  into the one stream of ITPO-norm, as the recipe does).
- Each stream goes through PRIME's `masked_rloo` (the kit's `rloo_advantages` with a mask: the baseline
  sum_j m_j / (G - 1) is subtracted at every reward position), times its coefficient; the streams are summed,
  returns are the reverse cumsum over the whole response (gamma = 1, across turns) and the advantages their
  masked whitening over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paperflow.core.lm.losses import masked_whiten, reverse_cumsum, rloo_advantages

METHODS = ("outcome", "prime", "itpo", "itponorm", "itponorm_grpo")
PRM_METHODS = ("prime", "itpo", "itponorm", "itponorm_grpo")
NORM_EPS = 1e-6


def turn_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """[N, L] long: k (1-based) on the tokens of turn k of each row, 0 elsewhere."""
    m = response_mask.long()
    starts = (m - torch.nn.functional.pad(m, (1, 0))[:, :-1]) == 1
    return starts.long().cumsum(1) * m


def turn_ends(response_mask: torch.Tensor) -> torch.Tensor:
    """[N, L] bool: the last token of each turn."""
    m = response_mask.long()
    return (m == 1) & (torch.nn.functional.pad(m, (0, 1))[:, 1:] == 0)


def last_turn_end(response_mask: torch.Tensor) -> torch.Tensor:
    """[N, L] bool: the last token of each row's last turn (the outcome's position)."""
    ends = turn_ends(response_mask)
    count = ends.long().cumsum(1)
    return ends & (count == ends.long().sum(1, keepdim=True)) & (ends.sum(1, keepdim=True) > 0)


def batch_norm_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """PRIME's `batch_norm` of the PRM token scores: divided by the largest |reverse cumsum| over the batch."""
    r = scores * response_mask.to(scores.dtype)
    return r / (reverse_cumsum(r).abs().max() + NORM_EPS)


@dataclass(frozen=True)
class Turns:
    """Per-turn statistics, padded to the batch's largest turn count K: [N, K]."""

    sums: torch.Tensor  # S_k
    counts: torch.Tensor  # n_k
    valid: torch.Tensor  # bool, the row has a turn k

    @property
    def length_share(self) -> torch.Tensor:
        """n_k / sum_j n_j (0 on missing turns)."""
        return self.counts / self.counts.sum(1, keepdim=True).clamp(min=1)

    @property
    def mean_count(self) -> torch.Tensor:
        """n_bar: the mean turn length over every turn of the batch (the recipe's `global_avg_count`)."""
        return self.counts[self.valid].mean()


def turn_stats(scores: torch.Tensor, response_mask: torch.Tensor) -> Turns:
    ids = turn_ids(response_mask)
    k = int(ids.max()) if ids.numel() else 0
    one_hot = torch.nn.functional.one_hot(ids, k + 1)[..., 1:].to(scores.dtype)  # [N, L, K]
    sums = torch.einsum("nl,nlk->nk", scores * response_mask.to(scores.dtype), one_hot)
    counts = one_hot.sum(1)
    return Turns(sums, counts, counts > 0)


def proportions_itpo(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """ITPO's turn rewards [N, K]: the raw turn sums S_k (`calculate_segment_proportions_itpo`)."""
    t = turn_stats(scores, response_mask)
    return torch.where(t.valid, t.sums, 0.0)


def proportions_itponorm(scores: torch.Tensor, response_mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """ITPO-norm's turn weights [N, K]: softmax over each row's turns of (S_k / n_k) * n_bar / T
    (`calculate_segment_proportions_itponorm`); each row sums to 1."""
    t = turn_stats(scores, response_mask)
    means = t.sums / t.counts.clamp(min=1)
    logits = torch.where(t.valid, means * t.mean_count / temperature, float("-inf"))
    return torch.softmax(logits, 1).nan_to_num(0.0)


def at_turn_ends(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[N, K] per-turn values placed on the last token of each turn: [N, L]."""
    ends = turn_ends(response_mask)
    k = (ends.long().cumsum(1) - 1).clamp(min=0)
    if values.shape[1] == 0:
        return torch.zeros(ends.shape, dtype=values.dtype)
    return torch.where(ends, values.gather(1, k.clamp(max=values.shape[1] - 1)), 0.0)


@dataclass(frozen=True)
class Stream:
    """One reward stream: values at its positions, and its coefficient."""

    values: torch.Tensor  # [N, L]
    positions: torch.Tensor  # [N, L] bool
    coef: float


def reward_streams(
    method: str,
    response_mask: torch.Tensor,
    outcome: torch.Tensor,
    length_cost: torch.Tensor,
    scores: torch.Tensor | None,
    *,
    temperature: float,
    dpo_coef: float,
    gt_coef: float,
) -> list[Stream]:
    """The reward streams of `method` (spec sections 2.3-2.4): `outcome` s [N] (the PRM target), `length_cost`
    [N] (token_amount_weighted, <= 0), `scores` [N, L] the batch-normed PRM token rewards (PRM methods)."""
    ends = turn_ends(response_mask)
    if method == "outcome":
        last = last_turn_end(response_mask)
        # the outcome-only baseline (reward_dpo_coef = 0): the whole weighted reward, length term included, at
        # the last token of the last turn
        return [Stream(torch.where(last, (outcome + length_cost)[:, None], 0.0), last, gt_coef)]
    if scores is None:
        raise ValueError(f"method {method!r} needs the PRM's token scores")
    length = at_turn_ends(length_cost[:, None] * turn_stats(scores, response_mask).length_share, response_mask)
    if method == "prime":
        # PRIME as its recipe runs it (reward_dpo_coef = reward_gt_coef = 5): the dense implicit rewards, the
        # verifier's outcome on the last token (the length has its own stream), and the length stream
        dense = scores * response_mask.to(scores.dtype)
        last = last_turn_end(response_mask)
        return [
            Stream(dense, response_mask.bool(), dpo_coef),
            Stream(length, ends, dpo_coef),
            Stream(torch.where(last, outcome[:, None], 0.0), last, gt_coef),
        ]
    if method == "itpo":
        turn = at_turn_ends(proportions_itpo(scores, response_mask), response_mask)
        return [Stream(length, ends, dpo_coef), Stream(turn, ends, dpo_coef)]
    if method in ("itponorm", "itponorm_grpo"):
        weights = proportions_itponorm(scores, response_mask, temperature)
        return [Stream(at_turn_ends(outcome[:, None] * weights, response_mask) + length, ends, dpo_coef)]
    raise ValueError(f"method {method!r} is not one of {METHODS}")


def group_normalised(values: torch.Tensor, positions: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO's step in place of the leave-one-out one (spec section 2.5, reconstructed): each reward position minus
    the group mean of the rows' mean rewards, over their std + 1e-6."""
    m = positions.to(values.dtype)
    means = (values * m).sum(1) / m.sum(1).clamp(min=1)
    groups = means.view(-1, group_size)
    mu = groups.mean(1).repeat_interleave(group_size)
    sd = groups.std(1).repeat_interleave(group_size)
    return (values - mu[:, None]) / (sd[:, None] + 1e-6) * m


def advantages(
    streams: list[Stream], response_mask: torch.Tensor, group_size: int, baseline: str = "rloo"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages, returns, summed token rewards) [N, L] of `compute_rloo_advantage_return`: each stream's
    leave-one-out step (or GRPO's group normalisation), times its coefficient, summed; returns-to-go over the
    response (gamma = 1); advantages = the masked whitening of the returns over the batch."""
    if baseline not in ("rloo", "grpo"):
        raise ValueError(f"baseline {baseline!r} is not one of ('rloo', 'grpo')")
    m = response_mask.to(torch.float32)
    total = torch.zeros_like(m)
    for s in streams:
        if baseline == "rloo":
            step = rloo_advantages(s.values.float(), group_size, s.positions)
        else:
            step = group_normalised(s.values.float(), s.positions, group_size)
        total = total + step * s.coef
    returns = reverse_cumsum(total * m)
    return masked_whiten(returns, m), returns, total


def advantage_volatility(adv: torch.Tensor, response_mask: torch.Tensor) -> float:
    """Spec section 8: the std of A_t over the tokens of each trajectory, averaged over trajectories."""
    m = response_mask.to(adv.dtype)
    n = m.sum(1)
    mean = (adv * m).sum(1) / n.clamp(min=1)
    var = (((adv - mean[:, None]) ** 2) * m).sum(1) / (n - 1).clamp(min=1)
    return float(var.sqrt()[n > 1].mean()) if bool((n > 1).any()) else 0.0


def proportion_variance(scores: torch.Tensor, response_mask: torch.Tensor, temperature: float) -> float:
    """`rm/proportion_variance`: the mean over trajectories of the variance of the ITPO-norm weights w_k."""
    w = proportions_itponorm(scores, response_mask, temperature)
    t = turn_stats(scores, response_mask)
    k = t.valid.sum(1).clamp(min=1)
    mean = w.sum(1) / k
    var = (((w - mean[:, None]) ** 2) * t.valid).sum(1) / k
    return float(var.mean())
