"""The RLVR loop of EAPO and its baselines (spec sections 2-3, reconstructed parts flagged there).

One step of every method:
1. draw `prompts_per_step` prompts and repeat each G times (rows [0, G) are prompt 0's);
2. sample the pure on-policy rows of every group (the last G - G_aug) from pi_old; their answer-token entropies
   update the critical threshold tau_H (an EMA of the `quantile` of each batch's entropies), so tau_H is fixed
   before any augmented token is drawn;
3. sample the first G_aug rows of every group with the injection hook (EAPO: at a critical step, with
   probability alpha, the token comes from the frozen prior pi_E; the log-prob recorded is the mixture
   mu = (1 - alpha) pi_old + alpha pi_E at every critical step, pi_old elsewhere);
4. rewards, GRPO advantages over all G rows, and `ppo_epochs` updates of the token-mean clipped surrogate with
   the recorded log-probs as the behaviour policy.

GRPO is the same step without a hook (G_aug rows are sampled second as well, so EAPO with alpha = 0 takes
GRPO's steps bit for bit). DAPO adds dynamic sampling; LUFFY replaces the last row of each group by a pi_E trace
trained with the shaped loss -A f(pi_theta), f(p) = p / (p + gamma); `from_prior` is GRPO started from pi_E.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from paperflow.core.config import ConfigError
from paperflow.core.lm.losses import clipped_surrogate, dynamic_sampling_keep, group_advantages
from paperflow.core.lm.sampling import (
    CachedForward,
    Rollout,
    StepOverride,
    StepState,
    inverse_cdf,
    sample,
    sequence_logprobs,
)
from paperflow.eapo.methods import Method, method
from paperflow.eapo.task import AdditionTask, Batch, accuracy

log = logging.getLogger(__name__)

IS_MODES = ("mixture_clip", "truncated", "luffy_shape")
CRITICAL_RULES = ("entropy", "kl", "entropy_and_kl")


@dataclass
class Settings:
    """The loop's settings (config keys `rl` and `eapo`/`luffy`/`dapo`, spec section 7)."""

    steps: int
    prompts_per_step: int
    group_size: int
    lr: float
    eps_low: float
    eps_high: float
    temperature: float
    ppo_epochs: int
    adv_eps: float
    grad_clip: float | None
    eval_every: int
    g_aug: int = 4
    alpha: float = 1.0
    quantile: float = 0.8
    ema: float = 0.9
    critical_rule: str = "entropy"
    is_mode: str = "mixture_clip"
    c_max: float = 2.0
    random_rate: float = 0.2
    luffy_gamma: float = 0.1
    max_refill: int = 3

    @classmethod
    def from_config(
        cls, rl: Mapping[str, Any], eapo: Mapping[str, Any], luffy: Mapping[str, Any], dapo: Mapping[str, Any]
    ):
        s = cls(**rl, **eapo, luffy_gamma=luffy["gamma"], max_refill=dapo["max_refill"])
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
    """The EAPO hook over the augmented rows: decides the critical steps from pi_old alone (entropy >= tau_H,
    KL(pi_E || pi_old) >= tau_KL, or a coin of fixed rate), injects pi_E's draw with probability alpha, and records
    the mixture's log-prob. Its own generator draws every coin and prior token, so the policy's draws are the ones
    a run without injection takes. Keeps, per step, the critical and injected flags and pi_old's argmax."""

    prior: Any
    settings: Settings
    rule: str  # critical | random
    tau: float
    tau_kl: float
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
                    "kl": torch.zeros_like(state.entropies),
                    "prior_token": torch.full_like(state.tokens, -1),
                }
            )
            return None
        if self.forward is None:
            self.forward = CachedForward(self.prior)
        # pi_E runs on the augmented rows only (the same rows every step, so its KV cache stays aligned)
        prior_logits = self.forward(state.input_ids[self.rows], state.attention_mask[self.rows]).float()
        prior_logp = state.logprobs.clone()  # pure rows: pi_old itself (never injected, KL 0)
        prior_logp[self.rows] = torch.log_softmax(
            prior_logits if state.temperature in (0, 1) else prior_logits / state.temperature, -1
        )
        n = state.tokens.shape[0]
        device = state.logprobs.device  # the paper scale samples on a GPU (the generator lives there too)
        coins = torch.rand(n, 2, generator=self.generator, dtype=torch.float64, device=device)
        kl = (prior_logp.exp() * (prior_logp - state.logprobs)).sum(-1)
        if self.rule == "random":
            critical = coins[:, 0] < s.random_rate
        elif s.critical_rule == "entropy":
            critical = state.entropies >= self.tau
        elif s.critical_rule == "kl":
            critical = kl >= self.tau_kl
        else:
            critical = (state.entropies >= self.tau) & (kl >= self.tau_kl)
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
                "kl": kl,
                "prior_token": torch.where(self.rows, prior_token, -1),  # the prior's draw (augmented rows)
            }
        )
        if self.denominator == "policy":  # noIS: the replaced rows record pi_old's log-prob of the injected token
            return StepOverride(tokens=token, logprobs=None, replace=inject)
        return StepOverride(tokens=token, logprobs=mu, replace=inject, record=critical)

    def flags(self) -> dict[str, torch.Tensor]:
        """[B, T] stacks of the per-step records."""
        keys = ("critical", "inject", "argmax", "kl", "prior_token")
        return {k: torch.stack([st[k] for st in self.steps], 1) for k in keys}


def _rollout(model, batch: Batch, task: AdditionTask, s: Settings, generator, hook=None) -> Rollout:
    return sample(
        model,
        batch.prompt_ids,
        batch.prompt_mask,
        max_new_tokens=task.answer_length,
        temperature=s.temperature,
        generator=generator,
        eos_token_id=task.eos,
        pad_token_id=task.pad,
        hook=hook,
    )


def _pad_to(x: torch.Tensor, width: int, value) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    return torch.cat([x, torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype)], 1)


@dataclass
class StepData:
    """One step's rollouts in group order with what the loss and the logs need (all [N, T] unless noted)."""

    sequences: torch.Tensor  # [N, P + T]
    prompt_length: int
    prompt_mask: torch.Tensor  # [N, P] 1 on real prompt tokens (left padding 0)
    mask: torch.Tensor  # completion mask
    old_logp: torch.Tensor  # the recorded behaviour log-probs
    entropies: torch.Tensor
    rewards: torch.Tensor  # [N]
    gold: torch.Tensor  # [N, 4]
    augmented: torch.Tensor  # [N] bool
    special: torch.Tensor  # bool: tokens under a non-PPO loss (injected under truncated/luffy_shape, LUFFY traces)
    critical: torch.Tensor  # bool
    injected: torch.Tensor  # bool
    argmax: torch.Tensor  # pi_old's argmax at each step (augmented rows; -1 elsewhere)
    prior_token: torch.Tensor  # the experience prior's draw at each step (augmented rows of injecting methods; -1)
    luffy_rows: torch.Tensor  # [N] bool


class Runner:
    """One RL run: the policy, its optimiser, the frozen prior, the generators and the running threshold."""

    def __init__(self, policy, prior, m: Method, s: Settings, task: AdditionTask, seed: int, exclude: Sequence[Any]):
        self.policy, self.prior, self.m, self.s, self.task, self.exclude = policy, prior, m, s, task, exclude
        if self.prior is not None:
            self.prior.eval()  # frozen: only ever run under no_grad (the sampler and the thresholds)
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=s.lr, weight_decay=0.0)
        self.sampler = torch.Generator().manual_seed(seed)
        self.injector_gen = torch.Generator().manual_seed(seed + 7919)
        self.prompt_rng = np.random.default_rng(seed)
        self.tau: float | None = None
        self.tau_kl: float | None = None
        # counts over augmented answer tokens: [position, injected, pi_old's argmax wrong, the prior's draw correct]
        self.mechanism = np.zeros((4, 2, 2, 2), dtype=np.int64)

    # --- rollouts -------------------------------------------------------------------------------------------
    def _update_threshold(self, pure: Rollout) -> None:
        self._update_threshold_from(pure.entropies, pure.completion_mask)

    def _update_threshold_from(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """tau_H <- EMA of the `quantile` of the answer-token entropies of pure on-policy rows."""
        values = entropies[mask.bool()]
        if values.numel() == 0:
            return
        q = float(torch.quantile(values, self.s.quantile))
        self.tau = q if self.tau is None else self.s.ema * self.tau + (1 - self.s.ema) * q

    def _update_kl_threshold(self, roll: Rollout, rows: torch.Tensor | None = None) -> None:
        """tau_KL <- EMA of the `quantile` of KL(pi_E || pi_old) over the answer tokens of `rows` (default all)."""
        T = self.s.temperature if self.s.temperature > 0 else 1.0
        with torch.no_grad():
            ids, P = roll.sequences, roll.prompt_length
            attn = roll.attention_mask
            logp_old = torch.log_softmax(self.policy(input_ids=ids, attention_mask=attn).logits.float() / T, -1)
            logp_e = torch.log_softmax(self.prior(input_ids=ids, attention_mask=attn).logits.float() / T, -1)
        kl = (logp_e.exp() * (logp_e - logp_old)).sum(-1)[:, P - 1 : -1]
        mask = roll.completion_mask.bool()
        if rows is not None:
            mask = mask & rows[:, None]
        q = float(torch.quantile(kl[mask], self.s.quantile))
        self.tau_kl = q if self.tau_kl is None else self.s.ema * self.tau_kl + (1 - self.s.ema) * q

    def calibrate(self, prompts: Batch) -> None:
        """The first tau_H (and tau_KL): the quantile over one pure rollout of the starting policy on `prompts`,
        drawn with the injector's generator (the policy's draws and the prompt stream stay those of GRPO)."""
        self.policy.eval()
        pure = _rollout(self.policy, prompts.repeat(self.s.group_size), self.task, self.s, self.injector_gen)
        self._update_threshold(pure)
        if self.s.critical_rule != "entropy":
            self._update_kl_threshold(pure)

    def collect(self, prompts: Batch) -> StepData:
        """One call of the sampler over all G rows of every prompt; the hook injects on the first G_aug rows of
        each group with the thresholds fixed before the step; then the pure rows' entropies update them."""
        s, m, task = self.s, self.m, self.task
        G = s.group_size
        g_aug = 1 if m.luffy else s.g_aug
        rows = prompts.repeat(G)
        augmented = (torch.arange(len(rows)) % G) < g_aug
        self.policy.eval()
        injector = None
        if m.inject:
            injector = Injector(
                self.prior, s, m.inject, self.tau, self.tau_kl or 0.0, self.injector_gen, augmented, m.denominator
            )
        roll = _rollout(self.policy, rows, task, s, self.sampler, hook=injector)
        completion, mask, old_logp = roll.completion_ids, roll.completion_mask, roll.logprobs
        zeros = torch.zeros_like(mask, dtype=torch.bool)
        critical, injected, argmax, prior_token = zeros, zeros, torch.full_like(mask, -1), torch.full_like(mask, -1)
        if injector is not None:
            f = injector.flags()
            critical, injected, argmax = f["critical"], f["inject"], torch.where(augmented[:, None], f["argmax"], -1)
            prior_token = f["prior_token"]
        luffy_rows = augmented if m.luffy else torch.zeros_like(augmented)
        if m.luffy:  # the off-policy rows: whole traces of pi_E, drawn with the injector's generator
            trace = _rollout(self.prior, prompts.repeat(g_aug), task, s, self.injector_gen)
            width = max(completion.shape[1], trace.completion_ids.shape[1])
            completion, mask, old_logp = (
                _pad_to(x, width, v) for x, v in ((completion, task.pad), (mask, 0), (old_logp, 0.0))
            )
            completion[augmented] = _pad_to(trace.completion_ids, width, task.pad)
            mask[augmented] = _pad_to(trace.completion_mask, width, 0)
            old_logp[augmented] = 0.0  # LUFFY takes the behaviour probability as 1
            entropies = _pad_to(roll.entropies, width, 0.0)
            critical, injected, argmax, prior_token = (
                _pad_to(x, width, v) for x, v in ((critical, False), (injected, False), (argmax, -1), (prior_token, -1))
            )
        else:
            entropies = roll.entropies
        pure = ~augmented
        self._update_threshold_from(entropies[pure], mask[pure])
        if m.inject == "critical" and s.critical_rule != "entropy":
            self._update_kl_threshold(roll, pure)
        rewards = task.reward_ids(rows, completion)
        special = (
            (luffy_rows[:, None] & mask.bool()) if m.luffy else (injected if s.is_mode != "mixture_clip" else zeros)
        )
        sequences = torch.cat([rows.prompt_ids, completion], 1)
        return StepData(
            sequences,
            rows.prompt_ids.shape[1],
            rows.prompt_mask,
            mask,
            old_logp,
            entropies,
            rewards,
            rows.answer_ids,
            augmented,
            special,
            critical,
            injected,
            argmax,
            prior_token,
            luffy_rows,
        )

    # --- loss -----------------------------------------------------------------------------------------------
    def loss(self, d: StepData, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Token-mean over all completion tokens: the clipped surrogate (behaviour log-probs as old) on ordinary
        tokens, and the special tokens' own loss (LUFFY's shaping on its traces; EAPO's truncated or shaped IS)."""
        s = self.s
        attn = torch.cat([d.prompt_mask.long(), d.mask.long()], 1)  # left-padded prompt, then the completion
        logp = sequence_logprobs(self.policy, d.sequences, attn, s.temperature)[:, d.prompt_length :]
        mask = d.mask.bool()
        count = mask.sum().clamp(min=1)
        ordinary = mask & ~d.special
        loss, stats = clipped_surrogate(
            logp, d.old_logp, advantages, ordinary, s.eps_low, s.eps_high, "token_mean", token_count=count
        )
        if bool(d.special.any()):
            adv = advantages[:, None].expand_as(logp)
            p = logp.exp()
            if self.m.luffy or s.is_mode == "luffy_shape":
                f = p / (p + s.luffy_gamma)
                if not self.m.luffy:  # EAPO's shaped IS: f(pi_theta) / f(mu)
                    mu = d.old_logp.exp()
                    f = f / (mu / (mu + s.luffy_gamma))
                extra = -adv * f
            else:  # truncated IS: min(rho, c_max), held fixed, times the score function
                w = torch.clamp(torch.exp(logp - d.old_logp), max=s.c_max).detach()
                extra = -adv * w * logp
            loss = loss + (extra * d.special).sum() / count
        return loss, stats

    def step(self, prompts: Batch) -> dict[str, float]:
        s, m = self.s, self.m
        d = self.collect(prompts)
        zero_var = 1.0 - float(dynamic_sampling_keep(d.rewards, s.group_size).float().mean())
        if m.dynamic_sampling:
            d = self._refill(d, prompts)
        advantages = group_advantages(d.rewards, s.group_size, eps=s.adv_eps, unbiased=False)
        self.policy.train()
        for _ in range(s.ppo_epochs):
            loss, stats = self.loss(d, advantages)
            self.optimizer.zero_grad()
            loss.backward()
            if s.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), s.grad_clip)
            self.optimizer.step()
        self._count_mechanism(d)
        mask = d.mask.bool()
        aug_mask = mask & d.augmented[:, None]
        n_aug = float(aug_mask.sum())
        return {
            "loss": float(loss.detach()),
            "reward": float(d.rewards.mean()),
            "zero_variance_groups": zero_var,
            "entropy": float(d.entropies[mask].mean()),
            "tau": float(self.tau),
            "critical_rate": float((d.critical & aug_mask).sum()) / n_aug if n_aug else float("nan"),
            "injection_rate": float((d.injected & aug_mask).sum()) / n_aug if n_aug else float("nan"),
            "clip_fraction": float(stats["clip_region_fraction"]),
            "tokens": float(mask.sum()),
        }

    def _refill(self, d: StepData, prompts: Batch) -> StepData:
        """DAPO's dynamic sampling: keep the groups with varied rewards, draw fresh prompts until the batch is full
        again or `max_refill` extra draws were made; a short batch trains as it is."""
        s, G = self.s, self.s.group_size
        parts = [(d, dynamic_sampling_keep(d.rewards, G))]
        kept = int(parts[0][1].sum()) // G
        for _ in range(s.max_refill):
            if kept >= len(prompts):
                break
            extra = self.task.draw(len(prompts), self.prompt_rng, self.exclude)
            e = self.collect(extra)
            keep = dynamic_sampling_keep(e.rewards, G)
            parts.append((e, keep))
            kept += int(keep.sum()) // G
        rows_needed = len(prompts) * G
        width = max(p.mask.shape[1] for p, _ in parts)
        fields = {}
        for name in StepData.__dataclass_fields__:
            vals = [getattr(p, name) for p, _ in parts]
            if name == "prompt_length":
                fields[name] = vals[0]
                continue
            pad = {"sequences": self.task.pad, "argmax": -1, "prior_token": -1}.get(name, 0)
            chunks = []
            for (p, keep), v in zip(parts, vals):
                if v.dim() == 2 and name not in ("gold", "prompt_mask"):
                    extra_width = width + (p.prompt_length if name == "sequences" else 0)
                    v = _pad_to(v, extra_width, pad if v.dtype != torch.bool else False)
                chunks.append(v[keep])
            fields[name] = torch.cat(chunks)[:rows_needed] if chunks else vals[0]
        if fields["rewards"].shape[0] == 0:  # nothing varied: train on the original batch (zero advantages)
            return d
        return StepData(**fields)

    def _count_mechanism(self, d: StepData) -> None:
        """Counts over augmented rows' answer tokens: [position, injected?, pi_old's argmax != gold?, the prior's
        draw == gold?] (the prior's draw is the token injected where the step is injected)."""
        if not bool(d.critical.any()) and self.m.inject is None:
            return
        rows = d.augmented
        width = min(d.mask.shape[1], d.gold.shape[1])
        for t in range(width):
            live = d.mask[rows, t].bool()
            inj = d.injected[rows, t][live].long().numpy()
            wrong = (d.argmax[rows, t] != d.gold[rows, t])[live].long().numpy()
            fixed = (d.prior_token[rows, t] == d.gold[rows, t])[live].long().numpy()
            np.add.at(self.mechanism[t], (inj, wrong, fixed), 1)


def train(
    policy,
    prior,
    method_name: str,
    s: Settings,
    task: AdditionTask,
    seed: int,
    test: Batch,
    exclude: Sequence[Any],
    progress: Callable[[dict[str, float]], None] | None = None,
    stop_above: float | None = None,
) -> tuple[Any, list[dict[str, float]], np.ndarray]:
    """`s.steps` RL steps of `method_name` from `policy` (trained in place); greedy accuracy on `test` (no
    injection) at step 0 and every `eval_every` steps. With `stop_above`, the run ends at the first evaluation whose
    accuracy exceeds it (`s.steps` is then the cap). Returns the policy, one record per step, and the mechanism
    counts."""
    m = method(method_name)
    if (m.inject or m.luffy) and prior is None:
        raise ValueError(f"method {method_name!r} needs an experience prior")
    torch.manual_seed(seed)
    runner = Runner(policy, prior, m, s, task, seed, exclude)
    if m.inject == "critical":
        runner.calibrate(task.draw(s.prompts_per_step, np.random.default_rng([seed, 1]), exclude))
    records = []
    bar = tqdm(range(s.steps + 1), desc=f"{method_name} seed {seed}", disable=not sys.stderr.isatty(), mininterval=5)
    for step in bar:
        rec: dict[str, float] = {"step": step}
        if step % s.eval_every == 0 or step == s.steps:
            rec["test_accuracy"] = accuracy(policy, task, test)
        done = stop_above is not None and rec.get("test_accuracy", -1.0) > stop_above
        if step < s.steps and not done:  # a run that stops keeps the policy that was evaluated
            rec |= runner.step(task.draw(s.prompts_per_step, runner.prompt_rng, exclude))
        records.append(rec)
        if "test_accuracy" in rec:
            log.debug("%s seed %d step %d: greedy test accuracy %.3f", method_name, seed, step, rec["test_accuracy"])
        if progress is not None:
            progress(rec)
        if done:
            break
    return policy, records, runner.mechanism
