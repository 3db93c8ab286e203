"""RL and preference losses shared by the language-model papers, as pure torch functions over padded tensors.

Masks (bool or float) are 1 on the entries that count (a completion's tokens, EOS included) and 0 elsewhere.
Rewards come as consecutive groups of `group_size` rollouts of one prompt: rows [0, G) are prompt 0's, and so on.

Papers: GRPO (DeepSeekMath, arXiv 2402.03300), DAPO (arXiv 2503.14476), Dr. GRPO (arXiv 2503.20783), RLOO
(arXiv 2402.14740), PRIME (arXiv 2502.01456), DPO (arXiv 2305.18290), conservative DPO (Mitchell 2023).
Where TRL 1.16 has the formula, ours equals it on the same tensors (tests/core/lm/test_losses.py):

- `group_advantages` = GRPOTrainer._generate_and_score_completions: (r - group mean) / (std + 1e-4), std
  Bessel-corrected (trl.trainer.utils.nanstd); "batch" keeps the group mean and divides by the batch's std.
- `rloo_advantages` ([N] rewards) = RLOOTrainer._generate_and_score_completions: r_i - mean of the others.
- `clipped_surrogate` = GRPOTrainer._compute_loss for loss_type grpo / bnpo / dapo / dr_grpo, KL term included.
  TRL's "dapo" divides by the completion-token count of the whole generation batch (`num_items_in_batch`,
  divided by the number of processes, times gradient-accumulation steps over steps-per-generation): pass that
  count as `token_count`; without it the micro-batch's own count is used, which is TRL's "bnpo".
- `dpo_loss` at label_smoothing 0 = DPOTrainer._compute_loss with loss_type "sigmoid".

TRL 1.16 has no masked whitening (it went with the PPO trainer); `masked_whiten` follows the one in verl and
in TRL's former `trl.core` (Bessel-corrected variance, (x - mean) * rsqrt(var + 1e-8)), which PRIME and ITPO use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

AGGREGATIONS = ("sequence_mean", "token_mean", "fixed_length")
# TRL 1.16 GRPOConfig.loss_type -> our aggregation; accepted as `aggregation` names too
TRL_LOSS_TYPES = {"grpo": "sequence_mean", "bnpo": "token_mean", "dapo": "token_mean", "dr_grpo": "fixed_length"}
KL_KINDS = ("k1", "k2", "k3")
SCALES = ("group", "batch", "none")


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shapes differ: {', '.join(f'{k} {v}' for k, v in shapes.items())}")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N, ...] -> [N / G, G, ...]; refuses N not divisible by G."""
    if group_size < 1 or rewards.dim() == 0 or rewards.shape[0] % group_size:
        n = rewards.shape[0] if rewards.dim() else "a scalar"
        raise ValueError(f"{n} rewards do not split into groups of {group_size}")
    return rewards.reshape(rewards.shape[0] // group_size, group_size, *rewards.shape[1:])


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over the masked entries: all of them, or along `dim`."""
    _same_shape(x=x, mask=mask)
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum()
    return (x * m).sum(dim) / m.sum(dim)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries, times n / (n - 1) when `unbiased` (n = number of masked entries)."""
    centred = x - masked_mean(x, mask)
    var = masked_mean(centred**2, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        if n < 2:
            raise ValueError(f"the unbiased variance needs at least two masked entries, got {int(n)}")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps), statistics over the masked entries, variance Bessel-corrected (verl,
    former trl.core). With shift_mean=False the mean is added back: only the spread changes. Entries outside
    the mask are transformed too (callers zero them if they must)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def reverse_cumsum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns-to-go with gamma = 1: out[..., t] = sum_{s >= t} x[..., s] along `dim`."""
    return x.flip(dim).cumsum(dim).flip(dim)


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4, unbiased: bool = True
) -> torch.Tensor:
    """GRPO advantages [N] (DeepSeekMath eq. 3 with TRL's details): A_i = (r_i - mean_group r) / (std + eps),
    std = the group's std ("group"), the whole batch's std of r ("batch", the group mean still subtracted), or
    no division ("none"). TRL: eps 1e-4, `unbiased` std. A group of equal rewards gets A = 0."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not allowed; allowed values: {SCALES}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one per rollout, shape [N]; got {tuple(rewards.shape)}")
    groups = _groups(rewards, group_size)
    centred = (groups - groups.mean(1, keepdim=True)).reshape(rewards.shape)
    if scale == "none":
        return centred
    if scale == "group":
        std = groups.std(1, unbiased=unbiased, keepdim=True).expand_as(groups).reshape(rewards.shape)
    else:
        std = rewards.std(unbiased=unbiased)
    return centred / (std + eps)


def rloo_advantages(rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024 eq. 5).

    Rewards [N] (one per rollout): A_i = r_i - mean_{j != i} r_j over the other G - 1 rollouts of the group.

    Rewards [N, T] with `mask` [N, T] marking each rollout's reward positions (PRIME's token rewards, ITPO's
    turn-end rewards): the semantics of PRIME's `masked_rloo` (compute_rloo_advantage_return), which ITPO
    reuses. With m_j the mean of rollout j's rewards over its positions and b = sum_j m_j / (G - 1) (all G
    rollouts), every reward position becomes X_i[t] * G / (G - 1) - b, other entries 0. That is
    X_i[t] - (sum_j m_j - X_i[t]) / (G - 1): the baseline leaves out the position's own reward, not its
    rollout's mean, and is subtracted at every position. With one position per rollout it is the [N] formula."""
    if group_size < 2:
        raise ValueError(f"RLOO needs groups of at least 2 rollouts, got group_size={group_size}")
    if rewards.dim() == 1:
        if mask is not None:
            raise ValueError("a mask goes with per-position rewards [N, T]; rewards here are [N]")
        groups = _groups(rewards, group_size)
        others = (groups.sum(1, keepdim=True) - groups) / (group_size - 1)
        return (groups - others).reshape(rewards.shape)
    if rewards.dim() != 2 or mask is None:
        raise ValueError(
            f"per-position rewards must be [N, T] with a mask of their reward positions; got rewards "
            f"{tuple(rewards.shape)} and mask {None if mask is None else tuple(mask.shape)}"
        )
    _same_shape(rewards=rewards, mask=mask)
    m = mask.to(rewards.dtype)
    counts = m.sum(1)
    if (counts == 0).any():
        rows = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"rollouts {rows} have no reward position in the mask (their mean reward is undefined)")
    x = rewards * m
    means = _groups(x.sum(1) / counts, group_size)  # [P, G]
    baseline = (means.sum(1) / (group_size - 1)).repeat_interleave(group_size)  # [N]
    return (x * group_size / (group_size - 1) - baseline[:, None]) * m


def dynamic_sampling_keep(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic-sampling filter (DAPO eq. 11's constraint 0 < #correct < G), as a bool mask over rows [N]:
    False on every rollout of a group whose rewards are all equal (zero advantage, no gradient). The mask over
    groups is `keep.view(-1, G)[:, 0]`."""
    groups = _groups(rewards, group_size)
    varied = (groups != groups[:, :1]).flatten(1).any(1)
    return varied.repeat_interleave(group_size)


def _aggregation(name: str) -> str:
    if name in AGGREGATIONS:
        return name
    if name in TRL_LOSS_TYPES:
        return TRL_LOSS_TYPES[name]
    raise ValueError(
        f"aggregation {name!r} is not allowed; allowed values: {AGGREGATIONS} or TRL's loss types {tuple(TRL_LOSS_TYPES)}"
    )


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    aggregation: str,
    *,
    max_completion_length: int | None = None,
    token_count: float | torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_importance_weighted: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate with DAPO's decoupled clip range, per token [N, T]:
        l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A),   rho = exp(logp - old_logp)
    (DAPO eq. 10). `old_logp` is the log-prob each token was sampled with: pi_old, or EAPO's mixture behaviour
    policy. `advantages` is per sequence [N] or per token [N, T].

    A per-token KL estimate `kl` (see `kl_estimate`) enters as + kl_coef * kl (GRPO eq. 3's beta term), times rho
    when `kl_importance_weighted` (TRL 1.16's default use_bias_correction_kl=True; GRPO as published does not).

    Aggregation (or TRL's loss_type name): "sequence_mean" / "grpo": each sequence's token mean, then the mean over
    sequences; "token_mean" / "bnpo" / "dapo": the sum over all masked tokens divided by `token_count` (default:
    the masked tokens here; TRL's dapo passes the generation batch's count); "fixed_length" / "dr_grpo": the sum
    divided by N * max_completion_length. Gradient accumulation is the caller's (TRL divides grpo/bnpo/dr_grpo by
    the accumulation steps). Returns (loss, stats): the masked fractions of tokens clipped below (rho < 1 -
    eps_low, A < 0) and above (rho > 1 + eps_high, A > 0), and the mean ratio, as TRL logs them."""
    agg = _aggregation(aggregation)
    _same_shape(logp=logp, old_logp=old_logp, mask=mask)
    if logp.dim() != 2:
        raise ValueError(f"log-probs must be per token [N, T]; got {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [N] = {tuple(logp.shape[:1])} or [N, T] = {tuple(logp.shape)}"
        )
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0; got eps_low={eps_low}, eps_high={eps_high}")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if kl is not None:
        _same_shape(kl=kl, logp=logp)
        per_token = per_token + kl_coef * (kl * ratio if kl_importance_weighted else kl)
    elif kl_coef != 0.0:
        raise ValueError(f"kl_coef={kl_coef} needs the per-token `kl`")
    m = mask.to(per_token.dtype)
    summed = per_token * m
    if agg == "sequence_mean":
        loss = (summed.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif agg == "token_mean":
        count = m.sum() if token_count is None else torch.as_tensor(token_count, dtype=m.dtype)
        loss = summed.sum() / count.clamp(min=1.0)
    else:
        if max_completion_length is None:
            raise ValueError(f"aggregation {aggregation!r} divides by max_completion_length; pass it")
        loss = summed.sum() / (per_token.shape[0] * max_completion_length)
    low = ((ratio < 1 - eps_low) & (adv < 0)).to(m.dtype)
    high = ((ratio > 1 + eps_high) & (adv > 0)).to(m.dtype)
    stats = {
        "clip_low_fraction": masked_mean(low, m).detach(),
        "clip_high_fraction": masked_mean(high, m).detach(),
        "clip_region_fraction": masked_mean(torch.maximum(low, high), m).detach(),
        "ratio_mean": masked_mean(ratio, m).detach(),
    }
    return loss, stats


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimators of KL(pi || pi_ref) from tokens sampled from pi (Schulman, "Approximating KL
    divergence", 2020). With d = ref_logp - logp: k1 = -d (unbiased, can be < 0), k2 = d^2 / 2, k3 = exp(d) - d - 1
    (unbiased, >= 0; GRPO eq. 4 and TRL's per_token_kl)."""
    _same_shape(logp=logp, ref_logp=ref_logp)
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"KL estimator {kind!r} is not allowed; allowed values: {KL_KINDS}")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO's sigmoid loss per pair (DPO eq. 7) on summed sequence log-probs, with h = beta [(pi_w - ref_w) -
    (pi_l - ref_l)]: -log sigmoid(h); with label_smoothing eps (conservative DPO: the label is flipped with
    probability eps) -(1 - eps) log sigmoid(h) - eps log sigmoid(-h). Returns (losses, chosen rewards beta
    (pi_w - ref_w), rejected rewards beta (pi_l - ref_l)), the rewards detached. At pi = pi_ref every loss is log 2.
    TRL 1.16's "sigmoid" loss ignores label_smoothing (it feeds only "robust", "exo_pair" and "aot")."""
    _same_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5]; got {label_smoothing}")
    chosen = policy_chosen_logps - ref_chosen_logps
    rejected = policy_rejected_logps - ref_rejected_logps
    h = beta * (chosen - rejected)
    losses = -(1 - label_smoothing) * F.logsigmoid(h)
    if label_smoothing:
        losses = losses - label_smoothing * F.logsigmoid(-h)
    return losses, (beta * chosen).detach(), (beta * rejected).detach()
