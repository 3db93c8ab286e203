"""EAPO's rollouts through two vLLM servers (paper scale, `math.rollout_backend: vllm`): one serves the policy,
one the frozen experience model pi_E, both started with the kit's `paperflow.core.lm.serve` (`vllm serve` in the
lm-serve env) and spoken to over the OpenAI-compatible completions endpoint with token-id prompts.

Segment-wise sampling (`VLLMSampler.rollout`), batched over the rows, at most `max_rounds` rounds:
1. every live row asks the policy server for its continuation (the remaining token budget, temperature T, the
   top-`top_logprobs` log-probs of every step, a per-request seed drawn from the sampler's generator);
2. pure rows (the last G - G_aug of each group) take it whole; an augmented row scans it step by step: a step is
   critical when the step's entropy estimate is >= tau_H (`rule` critical; `random`: a coin of rate
   `random_rate`, eapo_randpos), and a critical step is injected with probability alpha (a coin). The row keeps
   its continuation up to its first injected step, cuts it there, and
3. asks the pi_E server for one token at that prefix (max_tokens 1, temperature T), appends it and goes back to 1.
   A row in its last round takes its continuation whole and marks nothing critical: the behaviour probability of
   those steps is the policy's own, so the importance ratio stays exact.

The rollout returns the tokens, the critical and injected flags and the entropy estimates; it records no
probability for the update. The learner recomputes pi_old (TRL's forward) and pi_E on the final sequences and
forms log mu = log((1 - alpha) pi_old + alpha pi_E) at the critical steps (`mixture_logprobs`): the importance
ratio is against the mixture behaviour policy with the learner's pi_old, whatever the server's weights were.

Entropy truncation: vLLM returns the top-k log-probs of each step, not the whole distribution, so the entropy is
estimated as H_k = -sum_{i <= k} p_i log p_i over the returned entries (the sampled token's entry included when it
is outside the top k). Every term of the full sum is >= 0, so H_k <= H (a lower bound); the unseen tail of mass
r = 1 - sum_i p_i contributes at most r log((V - k) / r). tau_H is the quantile of the same estimate on the pure
rows, so the critical rule is "H_k in the top 20% of H_k", which equals the exact rule where the tail is light
and ranks heavy-tailed steps lower than the exact entropy would. With k >= V (tiny vocabularies, the tests) the
estimate is exact. The server is started with `--logprobs-mode processed_logprobs` so that the log-probs are of
the temperature-scaled distribution the tokens are drawn from (the kit's sampler records the same law).

Weight sync (`sync_weights`): the policy server serves a folder of its own (a copy of the start model); the learner
(main process) overwrites that folder's weights with `save_pretrained` every `sync_every` optimiser steps, then
posts `{"method": "reload_weights"}` to the server's `/collective_rpc` (vLLM's dev-mode API: the server runs with
VLLM_SERVER_DEV_MODE=1; the workers' `reload_weights()` reloads the served folder from disk) and `/reset_prefix_cache`
(cached KV of the old weights). vLLM's native NCCL weight transfer (`--weight-transfer-config`, /update_weights)
would avoid the disk round trip but needs vLLM's trainer-side engine in the learner's env (envs/lm.yaml has no
vLLM; workflows/eapo/README.md). Between syncs the server's weights are up to sync_every - 1 steps stale; the ratio
still uses the learner's recomputed pi_old, so the staleness is an off-policy gap of the sampling distribution
that the update does not correct (sync_every: 1 removes it up to vLLM's and transformers' numerics).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from paperflow.core.lm import serve

log = logging.getLogger(__name__)

TOKEN_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids` spelling of a token
RULES = ("critical", "random")


def token_id(token: str) -> int:
    """The id of a token that vLLM spelt as 'token_id:<id>' (return_tokens_as_token_ids)."""
    if not token.startswith(TOKEN_PREFIX):
        raise serve.ServerError(f"a logprobs token {token!r} is not 'token_id:<id>' (return_tokens_as_token_ids)")
    return int(token[len(TOKEN_PREFIX) :])


def topk_entropy(top: Mapping[str, float]) -> float:
    """H_k = -sum p log p over the returned top-k log-probs of one step (a lower bound of the entropy)."""
    return float(-sum(math.exp(lp) * lp for lp in top.values() if lp > -math.inf))


@dataclass
class Segment:
    """One completion request's answer: the tokens and, per step, the top-k log-probs."""

    tokens: list[int]
    top: list[dict[str, float]]
    finish_reason: str | None


@dataclass
class Row:
    prompt: list[int]
    augmented: bool
    tokens: list[int] = field(default_factory=list)
    critical: list[bool] = field(default_factory=list)
    injected: list[bool] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    done: bool = False


class VLLMSampler:
    """Segment-wise EAPO sampling against a policy server and (for injecting methods) a pi_E server."""

    def __init__(self, policy: serve.Client, prior: serve.Client | None, *, top_logprobs: int, max_rounds: int) -> None:
        if top_logprobs < 1 or max_rounds < 1:
            raise ValueError(f"top_logprobs and max_rounds must be >= 1; got {top_logprobs}, {max_rounds}")
        self.policy, self.prior = policy, prior
        self.k, self.max_rounds = int(top_logprobs), int(max_rounds)

    @staticmethod
    def body(prefix: Sequence[int], max_tokens: int, temperature: float, logprobs: int, seed: int, stop_ids) -> dict:
        """The /completions parameters of one request (token-id prompt, token ids back, stop tokens kept)."""
        return {
            "prompt": [int(t) for t in prefix],
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "logprobs": int(logprobs),
            "seed": int(seed),
            "stop_token_ids": [int(t) for t in stop_ids],
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }

    def _request(self, client: serve.Client, body: Mapping[str, Any]) -> Segment:
        params = {k: v for k, v in body.items() if k != "prompt"}
        (choice,) = client.complete(body["prompt"], **params)
        lp = choice.get("logprobs") or {}
        tokens = [token_id(t) for t in lp.get("tokens") or []]
        top = [dict(d or {}) for d in lp.get("top_logprobs") or []]
        if len(top) != len(tokens):
            raise serve.ServerError(f"{len(tokens)} tokens but {len(top)} top_logprobs entries in a completion")
        return Segment(tokens, top, choice.get("finish_reason"))

    def _map(self, client: serve.Client, bodies: list[dict]) -> list[Segment]:
        return client.map(lambda b: self._request(client, b), bodies)

    def rollout(
        self,
        prompts: Sequence[Sequence[int]],
        augmented: Sequence[bool],
        *,
        rule: str | None,
        tau: float,
        alpha: float,
        random_rate: float,
        temperature: float,
        max_new_tokens: int,
        stop_ids: Sequence[int],
        generator: torch.Generator,
    ) -> list[Row]:
        """The rows' completions with EAPO's injection on the `augmented` rows (`rule` None: none injected)."""
        if rule is not None and rule not in RULES:
            raise ValueError(f"rule {rule!r} is not allowed; allowed values: {RULES} or None")
        if rule is not None and any(augmented) and self.prior is None:
            raise ValueError("an injecting rollout needs the pi_E server (prior client)")
        stops = {int(t) for t in stop_ids}
        rows = [Row(list(p), bool(a) and rule is not None) for p, a in zip(prompts, augmented)]

        def draw() -> float:
            return float(torch.rand((), generator=generator, dtype=torch.float64))

        def seed() -> int:
            return int(torch.randint(0, 2**31 - 1, (), generator=generator))

        for round_ in range(self.max_rounds):
            live = [r for r in rows if not r.done]
            if not live:
                break
            last = round_ == self.max_rounds - 1
            bodies = [
                self.body(r.prompt + r.tokens, max_new_tokens - len(r.tokens), temperature, self.k, seed(), stops)
                for r in live
            ]
            segments = self._map(self.policy, bodies)
            wants_prior: list[Row] = []
            for r, seg in zip(live, segments):
                cut = None
                for t, (tok, top) in enumerate(zip(seg.tokens, seg.top)):
                    h = topk_entropy(top)
                    critical = injected = False
                    if r.augmented and not last:
                        if rule == "random":
                            critical = draw() < random_rate
                        else:
                            critical = h >= tau
                        injected = critical and draw() < alpha
                    if injected:
                        cut = t
                        r.critical.append(True)
                        r.injected.append(True)
                        r.entropies.append(h)
                        break
                    r.tokens.append(tok)
                    r.critical.append(critical)
                    r.injected.append(False)
                    r.entropies.append(h)
                    if tok in stops:
                        break
                if cut is not None:
                    wants_prior.append(r)
                    continue
                ended = bool(r.tokens) and r.tokens[-1] in stops
                r.done = ended or len(r.tokens) >= max_new_tokens or seg.finish_reason == "stop" or not seg.tokens
            if wants_prior:
                bodies = [self.body(r.prompt + r.tokens, 1, temperature, 1, seed(), stops) for r in wants_prior]
                for r, seg in zip(wants_prior, self._map(self.prior, bodies)):
                    if len(seg.tokens) != 1:
                        raise serve.ServerError(f"the pi_E server answered {len(seg.tokens)} tokens for max_tokens 1")
                    r.tokens.append(seg.tokens[0])
                    r.done = seg.tokens[0] in stops or len(r.tokens) >= max_new_tokens
        unfinished = [i for i, r in enumerate(rows) if not r.done]
        if unfinished:  # only possible when max_rounds < the number of injections a row asked for, plus one
            raise RuntimeError(f"rows {unfinished[:5]} unfinished after {self.max_rounds} rounds (a bug)")
        return rows


def mixture_logprobs(old: torch.Tensor, prior: torch.Tensor, alpha: float) -> torch.Tensor:
    """log mu = log((1 - alpha) exp(old) + alpha exp(prior)), per token, in float64 (exactly `old` at alpha 0 and
    `prior` at alpha 1), returned in old's dtype: the learner's recomputation of rl.Injector's recorded log mu."""
    a = torch.tensor(float(alpha), dtype=torch.float64, device=old.device)
    mu = torch.logaddexp(old.double() + torch.log1p(-a), prior.double() + torch.log(a))
    return mu.to(old.dtype)


# --- the servers: commands, GPUs, weight sync ------------------------------------------------------------------
def gpu_split(visible: str | None, learner: int, policy: int, prior: int) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of the learner, the policy server and the pi_E server, from the job's visible GPUs
    (in that order: the first `learner`, the next `policy`, the next `prior`)."""
    ids = [x for x in (visible or "").split(",") if x.strip()]
    need = learner + policy + prior
    if len(ids) < need:
        raise RuntimeError(
            f"the vLLM rollout needs {need} GPUs (resources.train_gpus {learner} + math.vllm.policy_gpus {policy} "
            f"+ math.vllm.prior_gpus {prior}); CUDA_VISIBLE_DEVICES is {visible!r}"
        )
    return {
        "learner": ",".join(ids[:learner]),
        "policy": ",".join(ids[learner : learner + policy]),
        "prior": ",".join(ids[learner + policy : need]),
    }


def server_command(folder: str, name: str, port: int, gpus: int, settings: Mapping[str, Any], dtype: str) -> list:
    """`vllm serve` of one model for the rollouts: tensor parallel over its GPUs, top-k log-probs allowed, the
    processed (temperature-scaled) log-probs returned, any `math.vllm.extra_args` appended."""
    extra = [
        "--max-logprobs",
        str(int(settings["top_logprobs"])),
        "--logprobs-mode",
        "processed_logprobs",
        *settings.get("extra_args", []),
    ]
    return serve.vllm_command(
        folder,
        name,
        port=port,
        tensor_parallel_size=gpus,
        dtype=dtype,
        max_model_len=settings.get("max_model_len"),
        gpu_memory_utilization=settings.get("gpu_memory_utilization"),
        extra=extra,
        python=settings.get("python"),
    )


WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json")


def copy_model(src: str, dst: str) -> str:
    """A folder of the policy server's own (its weights are overwritten at every sync; the start model is not)."""
    if Path(dst).exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def root_url(base_url: str) -> str:
    """The server's root (its dev-mode routes) from the OpenAI base URL (…/v1)."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


RELOAD = {"method": "reload_weights"}


def sync_weights(model, folder: str, admin: serve.Client) -> None:
    """Write `model`'s weights into the served `folder` (save_pretrained into a temporary folder next to it, then
    each weight file moved over the old one, stale shards removed) and ask the server to reload them."""
    folder_path = Path(folder)
    with tempfile.TemporaryDirectory(dir=folder_path.parent, prefix=".sync-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        new = {p.name for pattern in WEIGHT_FILES for p in Path(tmp).glob(pattern)}
        if not new:
            raise RuntimeError(f"save_pretrained wrote no safetensors into {tmp}")
        for pattern in WEIGHT_FILES:
            for old in folder_path.glob(pattern):
                if old.name not in new:
                    old.unlink()
        for name in sorted(new):
            os.replace(Path(tmp) / name, folder_path / name)
    admin.post("/collective_rpc", RELOAD)
    admin.post("/reset_prefix_cache", {})
