"""EAPO's trainer at every scale: TRL's GRPOTrainer (`EAPOTrainer`) with EAPO's injecting sampler (`Rollout`),
built by `trainer` from in-memory parts (the digit world's runs, `paperflow.eapo.stages.run_trl`) or by `build` from
a paper-scale spec, started by `python -m paperflow.eapo.paper_train spec.json` (one process, or one per GPU under
torchrun; `paper.launch`).

TRL generates through `rollout_func` (`Rollout` below): the kit's step-wise sampler on the policy, with the
`rl.Injector` hook on the first `eapo.g_aug` rows of every group (pi_E's token at critical,
high-entropy steps, tau_H an EMA of the pure rows' entropy quantile, kept per process). Every method samples this
way, so GRPO is EAPO without the hook. TRL ignores the log-probs a rollout returns in its ratio (spec section 11),
so `EAPOTrainer` puts the recorded behaviour log-probs log mu in TRL's `old_per_token_logps` at the critical steps
(mixture IS, spec 2.3); elsewhere they stay pi_old's, computed by TRL's own forward. eapo_noIS keeps pi_old
everywhere (TRL's default), and with alpha = 0 nothing is replaced, so the run is GRPO's.

With `math.rollout_backend: vllm` the tokens come from two vLLM servers instead (`paperflow.eapo.vllm_rollout`:
segment-wise, cut at each injected critical step, one pi_E token there); the rollout then records no probability,
and `EAPOTrainer` recomputes pi_E's log-probs on the final sequences and sets log mu = log((1 - alpha) pi_old +
alpha pi_E) with TRL's pi_old at the critical steps. The main process syncs the policy server's weights every
`math.vllm.sync_every` optimiser steps.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from paperflow.eapo import rl, vllm_rollout
from paperflow.eapo.math_data import stop_ids
from paperflow.eapo.paper import ROLLOUT_BACKENDS

log = logging.getLogger(__name__)


def _pad(rows: Sequence[torch.Tensor], width: int, value, device) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r[:width].cpu()
    return out.to(device)


class Rollout:
    """TRL's `rollout_func`: completions of the process's prompts (G consecutive copies per prompt) from the policy,
    with EAPO's injection on the augmented rows when the method injects. Keeps what the trainer needs to set the
    behaviour log-probs (`take`) and one row of statistics per call (`stats`)."""

    def __init__(
        self,
        method: str,
        eapo: Mapping[str, Any],
        group_size: int,
        settings: Mapping[str, Any],
        prior,
        seed,
        backend: str = "transformers",
        vllm: Mapping[str, Any] | None = None,
        observer=None,
    ):
        self.m = rl.method(method)
        self.s = rl.Settings.from_config(group_size, eapo)
        self.prior = prior
        self.chunk = int(settings["batch_rows"])
        self.stop_tokens = list(settings.get("stop_tokens", []))
        if self.chunk % self.s.group_size:
            raise ValueError(f"math.rollout.batch_rows ({self.chunk}) must hold whole groups of {self.s.group_size}")
        self.seed = int(seed)
        self.tau: float | None = None
        self.generators: dict[str, torch.Generator] = {}
        self.stats: list[dict[str, float]] = []
        self._last: dict[str, list[torch.Tensor]] | None = None
        if backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"math.rollout_backend {backend!r} is not allowed; allowed values: {ROLLOUT_BACKENDS}")
        self.backend = backend
        self.vllm = dict(vllm or {})
        self.sampler = None
        self.synced_step = 0
        self._saved_generators: dict[str, torch.Tensor] = {}
        # observer(prompt_ids, flags, mask, augmented): called after each chunk of an injecting method with the
        # chunk's prompt ids, the injector's per-step flags (`rl.Injector.flags`), the completion mask [B, T] and
        # the augmented rows [B] (the digit world's mechanism counts, `paperflow.eapo.stages.MechanismCounts`)
        self.observer = observer
        if observer is not None and backend != "transformers":
            raise ValueError("a rollout observer reads the injector's flags: transformers backend only")
        if backend == "vllm":
            self.sampler = vllm_sampler(self.vllm, injects=bool(self.m.inject))

    @property
    def replaces_denominator(self) -> bool:
        """Whether the behaviour log-probs differ from pi_old's at some steps (true EAPO, alpha > 0)."""
        return bool(self.m.inject) and self.m.denominator == "mixture" and self.s.alpha > 0 and self.s.g_aug > 0

    def _generator(self, name: str, device, offset: int) -> torch.Generator:
        if name not in self.generators:
            self.generators[name] = torch.Generator(device=device).manual_seed(self.seed + offset)
            if name in self._saved_generators:  # a resumed run: the generator goes on where the checkpoint left it
                self.generators[name].set_state(self._saved_generators.pop(name))
        return self.generators[name]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this process's sampler: tau_H, the generators' states, the statistics so far
        and the step the policy server was last synced at."""
        return {
            "tau": self.tau,
            "generators": {k: g.get_state() for k, g in self.generators.items()},
            "stats": list(self.stats),
            "synced_step": self.synced_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tau = state["tau"]
        self.stats = list(state["stats"])
        self.synced_step = int(state["synced_step"])
        self.generators = {}
        self._saved_generators = dict(state["generators"])

    def take(self) -> dict[str, list[torch.Tensor]] | None:
        last, self._last = self._last, None
        return last

    def _sample(
        self, model, tokenizer, ids: list[list[int]], max_new: int, temperature: float, device, generator, hook=None
    ):
        from paperflow.core.lm.sampling import sample

        width = max(len(x) for x in ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        input_ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in ids], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
        return sample(
            model,
            input_ids,
            mask,
            max_new_tokens=max_new,
            temperature=temperature,
            generator=generator,
            eos_token_id=stop_ids(tokenizer, self.stop_tokens),
            pad_token_id=pad,
            hook=hook,
        )

    def _threshold(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        values = entropies[mask.bool()].float()
        if values.numel() == 0:
            return
        q = float(torch.quantile(values.cpu(), self.s.quantile))
        self.tau = q if self.tau is None else self.s.ema * self.tau + (1 - self.s.ema) * q

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        if self.backend == "vllm":
            return self._call_vllm(prompts, trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        device = trainer.accelerator.device
        G, n = self.s.group_size, len(prompts)
        if n % G or any(prompts[i] != prompts[i - i % G] for i in range(n)):
            raise ValueError(f"rollout: {n} prompts are not groups of {G} consecutive copies (TRL's RepeatSampler)")
        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        max_new = int(trainer.args.max_completion_length)
        temperature = float(trainer.args.temperature)
        was_training = model.training
        model.eval()
        if self.m.inject == "critical" and self.tau is None:  # the first tau_H: one pure rollout of the first chunk,
            calibrate = self._generator("calibrate", device, 1)  # its own draws: the policy's stay those of GRPO
            first = self._sample(model, tokenizer, ids[: self.chunk], max_new, temperature, device, calibrate)
            self._threshold(first.entropies, first.completion_mask)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        critical_rows, logp_rows, entropies, masks, augmented_all, injected_all = [], [], [], [], [], []
        for lo in range(0, n, self.chunk):
            part = ids[lo : lo + self.chunk]
            augmented = (torch.arange(len(part), device=device) % G) < self.s.g_aug
            hook = None
            if self.m.inject:
                hook = rl.Injector(
                    self.prior,
                    self.s,
                    self.m.inject,
                    float(self.tau if self.tau is not None else 0.0),
                    self._generator("injector", device, 7919),
                    augmented,
                    self.m.denominator,
                )
            policy = self._generator("policy", device, 0)
            roll = self._sample(model, tokenizer, part, max_new, temperature, device, policy, hook)
            mask = roll.completion_mask.bool()
            flags = hook.flags() if hook is not None and hook.steps else None
            if self.observer is not None and flags is not None:
                self.observer(part, flags, mask, augmented)
            critical = flags["critical"] & mask if flags is not None else torch.zeros_like(mask)
            injected = flags["inject"] & mask if flags is not None else torch.zeros_like(mask)
            for i, prompt_ids in enumerate(part):
                length = int(mask[i].sum())
                out["prompt_ids"].append(list(prompt_ids))
                out["completion_ids"].append(roll.completion_ids[i, :length].tolist())
                out["logprobs"].append(roll.logprobs[i, :length].tolist())
                critical_rows.append(critical[i, :length].cpu())
                logp_rows.append(roll.logprobs[i, :length].float().cpu())
            entropies.append(roll.entropies.cpu())
            masks.append(mask.cpu())
            augmented_all.append(augmented.cpu())
            injected_all.append(injected.sum().cpu())
        model.train(was_training)
        pure_entropy = torch.cat([e[~a].flatten() for e, a in zip(entropies, augmented_all)])
        pure_mask = torch.cat([m[~a].flatten() for m, a in zip(masks, augmented_all)])
        if self.m.inject == "critical":
            self._threshold(pure_entropy, pure_mask)
        aug_tokens = sum(int(m[a].sum()) for m, a in zip(masks, augmented_all))
        n_critical = sum(int(c.sum()) for c in critical_rows)
        self.stats.append(
            {
                "call": len(self.stats),
                "rows": n,
                "tau": float("nan") if self.tau is None else self.tau,
                "entropy": float(torch.cat([e[m] for e, m in zip(entropies, masks)]).float().mean()),
                "critical_rate": n_critical / aug_tokens if aug_tokens else float("nan"),
                "injection_rate": float(sum(injected_all)) / aug_tokens if aug_tokens else float("nan"),
            }
        )
        self._last = {"critical": critical_rows, "logprobs": logp_rows}
        return out

    # --- the vLLM backend -------------------------------------------------------------------------------------
    def maybe_sync(self, trainer) -> bool:
        """Every `sync_every` optimiser steps: the main process writes the learner's weights into the policy
        server's folder and has the server reload them; every process waits for it. True when it synced."""
        step = int(trainer.state.global_step)
        if step - self.synced_step < int(self.vllm["sync_every"]):
            return False
        from paperflow.core.lm import serve

        if trainer.accelerator.is_main_process:
            admin = serve.Client(
                vllm_rollout.root_url(self.vllm["policy_url"]), self.vllm["policy_name"], **_http(self.vllm)
            )
            vllm_rollout.sync_weights(
                trainer.accelerator.unwrap_model(trainer.model), self.vllm["policy_folder"], admin
            )
        trainer.accelerator.wait_for_everyone()
        self.synced_step = step
        return True

    def _call_vllm(self, prompts: list[str], trainer) -> dict[str, list]:
        self.maybe_sync(trainer)
        tokenizer = trainer.processing_class
        G, n = self.s.group_size, len(prompts)
        if n % G or any(prompts[i] != prompts[i - i % G] for i in range(n)):
            raise ValueError(f"rollout: {n} prompts are not groups of {G} consecutive copies (TRL's RepeatSampler)")
        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        common = {
            "temperature": float(trainer.args.temperature),
            "max_new_tokens": int(trainer.args.max_completion_length),
            "stop_ids": stop_ids(tokenizer, self.stop_tokens),
            "alpha": self.s.alpha,
            "random_rate": self.s.random_rate,
        }
        if self.m.inject == "critical" and self.tau is None:  # the first tau_H: a pure rollout of the first chunk
            first = self.sampler.rollout(
                ids[: self.chunk],
                [False] * min(n, self.chunk),
                rule=None,
                tau=0.0,
                generator=self._generator("calibrate", "cpu", 1),
                **common,
            )
            self._threshold(*_entropy_table(first))
        augmented = [(i % G) < self.s.g_aug for i in range(n)]
        rows = self.sampler.rollout(
            ids,
            augmented,
            rule=self.m.inject,
            tau=float(self.tau if self.tau is not None else 0.0),
            generator=self._generator("policy", "cpu", 0),
            **common,
        )
        entropies, mask = _entropy_table(rows)
        pure = ~torch.tensor(augmented)
        if self.m.inject == "critical":
            self._threshold(entropies[pure], mask[pure])
        aug_mask = mask[~pure]
        aug_tokens = int(aug_mask.sum())
        critical_rows = [torch.tensor(r.critical, dtype=torch.bool) for r in rows]
        n_critical = sum(int(c.sum()) for c in critical_rows)
        n_injected = sum(sum(r.injected) for r in rows)
        self.stats.append(
            {
                "call": len(self.stats),
                "rows": n,
                "tau": float("nan") if self.tau is None else self.tau,
                "entropy": float(entropies[mask].mean()) if bool(mask.any()) else float("nan"),
                "critical_rate": n_critical / aug_tokens if aug_tokens else float("nan"),
                "injection_rate": n_injected / aug_tokens if aug_tokens else float("nan"),
            }
        )
        self._last = {"critical": critical_rows, "recompute": True}
        return {
            "prompt_ids": [list(x) for x in ids],
            "completion_ids": [list(r.tokens) for r in rows],
            "logprobs": None,  # no probability is recorded: the learner recomputes pi_old and pi_E
        }


def _http(v: Mapping[str, Any]) -> dict[str, Any]:
    return {"timeout_s": float(v.get("timeout_s", 600)), "retries": int(v.get("retries", 3)), "backoff_s": 2.0}


def vllm_sampler(v: Mapping[str, Any], injects: bool):
    """The segment-wise sampler on the servers named in the spec's `vllm` block (pi_E's only when injecting)."""
    from paperflow.core.lm import serve

    http = {**_http(v), "concurrency": int(v.get("concurrency", 64))}
    policy = serve.Client(v["policy_url"], v["policy_name"], **http)
    prior = serve.Client(v["prior_url"], v["prior_name"], **http) if injects else None
    return vllm_rollout.VLLMSampler(policy, prior, top_logprobs=int(v["top_logprobs"]), max_rounds=int(v["max_rounds"]))


def _entropy_table(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' per-step entropy estimates [B, T] (0-padded) and their mask."""
    width = max((len(r.entropies) for r in rows), default=0)
    ent = torch.zeros(len(rows), max(width, 1))
    mask = torch.zeros(len(rows), max(width, 1), dtype=torch.bool)
    for i, r in enumerate(rows):
        ent[i, : len(r.entropies)] = torch.tensor(r.entropies, dtype=torch.float32)
        mask[i, : len(r.entropies)] = True
    return ent, mask


def eapo_trainer_class():
    """GRPOTrainer whose old log-probs are the behaviour policy's at the rollout's critical steps (TRL imported
    lazily: only the jobs that train need it)."""
    from trl import GRPOTrainer

    class EAPOTrainer(GRPOTrainer):
        eapo_rollout: Rollout | None = None

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            last = self.eapo_rollout.take() if self.eapo_rollout is not None else None
            if last is None or not self.eapo_rollout.replaces_denominator:
                return out
            completion = out["completion_ids"]
            width, device = completion.shape[1], completion.device
            critical = _pad(last["critical"], width, False, device)
            old = out.get("old_per_token_logps")
            if old is None:  # TRL skips pi_old when it equals pi_theta's detached log-probs; EAPO needs it
                ids = torch.cat([out["prompt_ids"], completion], 1)
                attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
                with torch.no_grad():
                    old, _, _ = self._get_per_token_logps_and_entropies(
                        self.model, ids, attn, width, batch_size=self.args.per_device_train_batch_size
                    )
            if last.get("recompute"):  # vLLM rollouts: log mu from the learner's pi_old and pi_E on the sequences
                mu = vllm_rollout.mixture_logprobs(old, self._prior_logps(out, width), self.eapo_rollout.s.alpha)
            else:
                mu = _pad(last["logprobs"], width, 0.0, device)
            out["old_per_token_logps"] = torch.where(critical, mu.to(old.dtype), old)
            return out

        @torch.no_grad()
        def _prior_logps(self, out, width: int) -> torch.Tensor:
            """pi_E's per-token log-probs [B, width] of the completions at TRL's temperature (left-padded prompt,
            right-padded completion: one span per row)."""
            from paperflow.core.lm.sampling import sequence_logprobs

            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
            attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
            logp = sequence_logprobs(
                self.eapo_rollout.prior,
                ids,
                attn,
                float(self.args.temperature),
                chunk_size=self.args.per_device_train_batch_size,
            )
            return logp[:, -width:]

    return EAPOTrainer


def _load(folder: str, dtype: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype))


def _tokenizer(folder: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def trainer(
    *,
    method: str,
    eapo: Mapping[str, Any],
    rollout: Mapping[str, Any],
    seed: int,
    args,
    policy,
    prior,
    tokenizer,
    dataset,
    reward_funcs,
    backend: str = "transformers",
    vllm: Mapping[str, Any] | None = None,
    observer=None,
):
    """EAPOTrainer with EAPO's `Rollout` from in-memory parts: the policy (trained in place), the frozen prior (None
    for methods that inject nothing), the tokenizer, the prompt dataset, TRL reward function(s) and a GRPOConfig.
    Both scales build their trainers here (`build` from a paper-scale spec; `paperflow.eapo.stages` on the digit
    world). `observer`: see `Rollout.observer`."""
    if prior is not None:
        prior.eval().requires_grad_(False)
    sampler = Rollout(
        method, eapo, args.num_generations, rollout, prior, seed, backend=backend, vllm=vllm, observer=observer
    )
    out = eapo_trainer_class()(
        model=policy,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=sampler,
    )
    out.eapo_rollout = sampler
    if prior is not None:
        prior.to(out.accelerator.device)
    return out


def build(spec: Mapping[str, Any]):
    """The trainer of one run from its spec (`paper.train_spec`), not yet trained."""
    from datasets import Dataset
    from trl import GRPOConfig

    from paperflow.core.device import pick
    from paperflow.core.io import read_frame
    from paperflow.eapo.math_reward import trl_math_reward

    device = pick(spec["device"], key="pretrained.device")
    frame, _ = read_frame(spec["train"])
    args = GRPOConfig(
        output_dir=spec.get("checkpoints") or str(Path(spec["out_dir"]) / "trl"),
        use_cpu=device.type == "cpu",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=not sys.stderr.isatty(),
        dataloader_num_workers=0,
        **spec["trl"],
    )
    return trainer(
        method=spec["method"],
        eapo=spec["eapo"],
        rollout=spec["rollout"],
        seed=spec["seed"],
        args=args,
        policy=_load(spec["start"], spec["dtype"]),
        prior=_load(spec["prior"], spec["dtype"]) if spec["prior"] is not None else None,
        tokenizer=_tokenizer(spec["start"]),
        dataset=Dataset.from_pandas(frame[["prompt", "answer"]], preserve_index=False),
        reward_funcs=trl_math_reward,
        backend=spec.get("rollout_backend", "transformers"),
        vllm=spec.get("vllm"),
    )


def rollout_file(checkpoint: str | Path, rank: int) -> Path:
    return Path(checkpoint) / f"eapo_rollout_rank{rank}.pt"


def rollout_checkpoint(rollout: Rollout, rank: int):
    """A callback that keeps each process's sampler state (`Rollout.state_dict`) in every checkpoint TRL writes, before
    `paperflow.core.lm.resume`'s TimedSave (added later, so called later) marks the checkpoint complete."""
    from transformers import TrainerCallback

    class RolloutCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            path = rollout_file(Path(args.output_dir) / f"checkpoint-{state.global_step}", rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(rollout.state_dict(), path.with_suffix(".tmp"))
            path.with_suffix(".tmp").replace(path)
            return control

    return RolloutCheckpoint()


def run(spec: Mapping[str, Any], every_s: float | None = None) -> None:
    """Train, then (main process) save the model folder, TRL's history and the rollout statistics. With
    `spec["checkpoints"]` (the job's checkpoint folder) TRL saves there at least every `every_s` seconds (default
    30 min) and a rerun resumes from the newest complete checkpoint, the sampler's state included."""
    from paperflow.core.lm import resume
    from paperflow.core.resume import EVERY_S

    trainer = build(spec)
    rank = trainer.accelerator.process_index
    trainer.add_callback(rollout_checkpoint(trainer.eapo_rollout, rank))
    last = resume.last_checkpoint(trainer.args.output_dir)
    if last and rollout_file(last, rank).exists():
        trainer.eapo_rollout.load_state_dict(torch.load(rollout_file(last, rank), weights_only=True))
    resume.train(trainer, EVERY_S if every_s is None else every_s)
    trainer.save_model(spec["out_dir"])
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(spec["out_dir"])
        rows = [r for r in trainer.state.log_history if "step" in r and "train_runtime" not in r]
        pd.DataFrame(rows).to_csv(spec["history"], index=False)
        pd.DataFrame(trainer.eapo_rollout.stats).to_csv(spec["rollouts"], index=False)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        raise SystemExit("usage: python -m paperflow.eapo.paper_train SPEC.json")
    logging.basicConfig(level=logging.INFO)
    run(json.loads(Path(argv[0]).read_text()))


if __name__ == "__main__":
    main()
