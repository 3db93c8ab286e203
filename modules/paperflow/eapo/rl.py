"""EAPO's injection hook (spec sections 2.2-2.3, reconstructed parts flagged there), used by the TRL rollout of
every scale (`paperflow.eapo.paper_train.Rollout`).

On the first `g_aug` rows of every group (the augmented rows), at a critical step (pi_old's entropy >= tau_H, or a
coin of fixed rate for eapo_randpos), the token comes with probability alpha from the frozen prior pi_E, and the
log-prob recorded is that of the mixture mu = (1 - alpha) pi_old + alpha pi_E at every critical step (pi_old
elsewhere). The other rows are pure on-policy; their entropies set tau_H (`Rollout`). With alpha = 0 or g_aug = 0
the policy's draws and recorded log-probs are those of a run without the hook, so EAPO is GRPO bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from paperflow.core.config import ConfigError
from paperflow.core.lm.sampling import CachedForward, StepOverride, StepState, inverse_cdf
from paperflow.eapo.methods import Method, method

__all__ = ["CRITICAL_RULES", "IS_MODES", "Injector", "Method", "Settings", "method"]

IS_MODES = ("mixture_clip",)  # the behaviour log-probs log mu in the clipped surrogate (EAPOTrainer)
CRITICAL_RULES = ("entropy",)  # the rule the rollout's tau_H serves


@dataclass
class Settings:
    """The injection's settings: `rl.group_size` and the config's `eapo` block."""

    group_size: int
    g_aug: int = 4
    alpha: float = 1.0
    quantile: float = 0.8
    ema: float = 0.9
    critical_rule: str = "entropy"
    is_mode: str = "mixture_clip"
    random_rate: float = 0.2

    @classmethod
    def from_config(cls, group_size: int, eapo: Mapping[str, Any]) -> Settings:
        s = cls(group_size=int(group_size), **{k: v for k, v in eapo.items() if k in cls.__dataclass_fields__})
        s.check()
        return s

    def check(self) -> None:
        if self.is_mode not in IS_MODES:
            raise ConfigError(f"eapo.is_mode {self.is_mode!r} is not allowed; allowed values: {IS_MODES}")
        if self.critical_rule not in CRITICAL_RULES:
            raise ConfigError(f"eapo.critical_rule {self.critical_rule!r} is not allowed; allowed: {CRITICAL_RULES}")
        if not 0 <= self.g_aug < self.group_size:
            raise ConfigError(f"eapo.g_aug must be in [0, group_size) = [0, {self.group_size}); got {self.g_aug}")


@dataclass
class Injector:
    """The EAPO hook over the augmented rows: decides the critical steps from pi_old alone (entropy >= tau_H, or a coin
    of fixed rate), injects pi_E's draw with probability alpha, and records
    the mixture's log-prob. Its own generator draws every coin and prior token, so the policy's draws are the ones
    a run without injection takes. Keeps, per step, the critical and injected flags and pi_old's argmax."""

    prior: Any
    settings: Settings
    rule: str  # critical | random
    tau: float
    generator: torch.Generator
    rows: torch.Tensor  # [B] bool, the augmented rows (the others are pure on-policy)
    denominator: str = "mixture"
    steps: list[dict[str, torch.Tensor]] = field(default_factory=list)
    forward: CachedForward | None = None

    def __call__(self, state: StepState) -> StepOverride | None:
        s = self.settings
        if not bool(self.rows.any()):  # G_aug = 0: nothing to inject, nothing to run pi_E on
            none = torch.zeros_like(state.done)
            self.steps.append(
                {
                    "critical": none,
                    "inject": none,
                    "argmax": state.logprobs.argmax(-1),
                    "prior_token": torch.full_like(state.tokens, -1),
                }
            )
            return None
        if self.forward is None:
            self.forward = CachedForward(self.prior)
        # pi_E runs on the augmented rows only (the same rows every step, so its KV cache stays aligned)
        prior_logits = self.forward(state.input_ids[self.rows], state.attention_mask[self.rows]).float()
        prior_logp = state.logprobs.clone()  # pure rows: pi_old itself (never injected)
        prior_logp[self.rows] = torch.log_softmax(
            prior_logits if state.temperature in (0, 1) else prior_logits / state.temperature, -1
        )
        n = state.tokens.shape[0]
        device = state.logprobs.device  # the paper scale samples on a GPU (the generator lives there too)
        coins = torch.rand(n, 2, generator=self.generator, dtype=torch.float64, device=device)
        if self.rule == "random":
            critical = coins[:, 0] < s.random_rate
        else:  # Settings.check admits CRITICAL_RULES only: the entropy rule
            critical = state.entropies >= self.tau
        critical = critical & ~state.done & self.rows
        inject = critical & (coins[:, 1] < s.alpha)
        u = torch.rand(n, 1, generator=self.generator, dtype=torch.float64, device=device)
        prior_token = inverse_cdf(prior_logp, u)
        token = torch.where(inject, prior_token, state.tokens)
        p_old = state.logprobs.gather(-1, token[:, None]).squeeze(-1)
        p_prior = prior_logp.gather(-1, token[:, None]).squeeze(-1)
        alpha = torch.tensor(float(s.alpha), dtype=torch.float64, device=device)
        mu = torch.logaddexp(
            p_old.double() + torch.log1p(-alpha), p_prior.double() + torch.log(alpha)
        ).float()  # log((1-a) p_old + a p_E): exactly log p_old at a = 0, log p_E at a = 1
        self.steps.append(
            {
                "critical": critical,
                "inject": inject,
                "argmax": state.logprobs.argmax(-1),
                "prior_token": torch.where(self.rows, prior_token, -1),  # the prior's draw (augmented rows)
            }
        )
        if self.denominator == "policy":  # noIS: the replaced rows record pi_old's log-prob of the injected token
            return StepOverride(tokens=token, logprobs=None, replace=inject)
        return StepOverride(tokens=token, logprobs=mu, replace=inject, record=critical)

    def flags(self) -> dict[str, torch.Tensor]:
        """[B, T] stacks of the per-step records."""
        keys = ("critical", "inject", "argmax", "prior_token")
        return {k: torch.stack([st[k] for st in self.steps], 1) for k in keys}
