"""RL and preference losses shared by the language-model papers, as pure torch functions over padded tensors.

Masks are 1 on the tokens that count (a completion's tokens, EOS included) and 0 elsewhere. Rewards come as
consecutive groups of `group_size` rollouts of one prompt. The formulas follow the papers (GRPO: DeepSeekMath
arXiv 2402.03300; DAPO: arXiv 2503.14476; Dr. GRPO: arXiv 2503.20783; RLOO: arXiv 2402.14740; DPO: arXiv
2305.18290) and equal TRL 1.16's on the same tensors (tests/core/lm/test_losses.py), where TRL's choices are:
GRPO's group std is Bessel-corrected and the advantage is (r - mean) / (std + 1e-4); the "dapo" loss divides
by the number of completion tokens in the whole generation batch (on one process without gradient accumulation,
the batch's token count: `token_mean` here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

AGGREGATIONS = ("sequence_mean", "token_mean", "fixed_length")
# TRL 1.16's GRPOConfig.loss_type -> the aggregation it uses (one process, no gradient accumulation)
TRL_LOSS_TYPES = {"grpo": "sequence_mean", "bnpo": "token_mean", "dapo": "token_mean", "dr_grpo": "fixed_length"}
KL_KINDS = ("k1", "k2", "k3")
SCALES = ("group", "batch", "none")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of {group_size}")
    return rewards.reshape(rewards.shape[0] // group_size, group_size, *rewards.shape[1:])


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over the masked entries (all of them, or along `dim`)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum()
    return (x * mask).sum(dim) / mask.sum(dim)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected when `unbiased`)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        if n < 2:
            raise ValueError("the unbiased variance needs at least two masked entries")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (unbiased variance); with shift_mean=False the mean
    is added back, so only the scale changes (PPO-style advantage whitening)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def reverse_cumsum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns-to-go: out[..., t] = sum_{s >= t} x[..., s] along `dim`."""
    return x.flip(dim).cumsum(dim).flip(dim)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO's advantages [N]: reward minus its group's mean, divided by (std + eps) where std is the group's
    ("group"), the whole batch's ("batch"), or not at all ("none"); stds Bessel-corrected, as TRL."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r}; allowed values: {SCALES}")
    groups = _groups(rewards, group_size)
    centred = (groups - groups.mean(1, keepdim=True)).reshape(rewards.shape)
    if scale == "none":
        return centred
    if scale == "group":
        std = groups.std(1, unbiased=True, keepdim=True).expand_as(groups).reshape(rewards.shape)
    else:
        std = rewards.std(unbiased=True)
    return centred / (std + eps)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i minus the mean of the other G - 1 rewards of its group. Rewards of shape
    [N] (one per rollout) or [N, T] (per position, as PRIME's token-level rewards: the baseline of position t
    is the mean over the group's other rollouts at t)."""
    if group_size < 2:
        raise ValueError("RLOO needs groups of at least 2 rollouts")
    groups = _groups(rewards, group_size)
    others = (groups.sum(1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(rewards.shape)


def dynamic_sampling_keep(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling filter [N] (bool): keep the rollouts of groups whose rewards are not all equal
    (a group of all-correct or all-wrong rollouts has zero advantage and no gradient)."""
    groups = _groups(rewards, group_size)
    varied = (groups != groups[:, :1]).flatten(1).any(1)
    return varied.repeat_interleave(group_size)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    aggregation: str,
    max_completion_length: int | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_importance_weighted: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate loss with asymmetric clipping (DAPO's clip-higher):
    -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), rho = exp(logp - old_logp) per token [N, T].
    `old_logp` is the log-prob the token was sampled with (EAPO passes its mixture behaviour policy here).
    `advantages` is per sequence [N] or per token [N, T]. Aggregation: "sequence_mean" (each sequence's token
    mean, then the batch mean: GRPO), "token_mean" (over every token of the batch: DAPO), "fixed_length" (the
    token sum over N x max_completion_length: Dr. GRPO). A per-token `kl` estimate (e.g. `kl_estimate`) enters
    as kl_coef * kl before the aggregation, as GRPO's beta term; `kl_importance_weighted` multiplies it by the
    ratio first (DeepSeek-V3.2's unbiased KL gradient, TRL 1.16's default `use_bias_correction_kl=True`; GRPO as
    published does not). Returns the loss and per-token statistics."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r}; allowed values: {AGGREGATIONS}")
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} differ")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if kl is not None:
        per_token = per_token + kl_coef * (kl * ratio if kl_importance_weighted else kl)
    m = mask.to(per_token.dtype)
    if aggregation == "sequence_mean":
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif aggregation == "token_mean":
        loss = (per_token * m).sum() / m.sum().clamp(min=1.0)
    else:
        if max_completion_length is None:
            raise ValueError("aggregation 'fixed_length' needs max_completion_length")
        loss = (per_token * m).sum() / (per_token.shape[0] * max_completion_length)
    low = (ratio < 1 - eps_low) & (adv < 0)
    high = (ratio > 1 + eps_high) & (adv > 0)
    stats = {
        "clip_low_fraction": masked_mean(low.to(m.dtype), m).detach(),
        "clip_high_fraction": masked_mean(high.to(m.dtype), m).detach(),
        "ratio_mean": masked_mean(ratio, m).detach(),
    }
    return loss, stats


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3; k3 is GRPO's and
    TRL's): with d = ref_logp - logp, k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1."""
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"KL estimator {kind!r}; allowed values: {KL_KINDS}")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO's sigmoid loss per pair, -log sigmoid(beta [(pi_w - ref_w) - (pi_l - ref_l)]) on summed sequence
    log-probs, and the implicit rewards beta (pi - ref) of the chosen and rejected completions (detached).
    At pi = pi_ref every loss is log 2."""
    chosen = policy_chosen_logps - ref_chosen_logps
    rejected = policy_rejected_logps - ref_rejected_logps
    losses = -F.logsigmoid(beta * (chosen - rejected))
    return losses, (beta * chosen).detach(), (beta * rejected).detach()
