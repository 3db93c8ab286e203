"""Why EAPO trails GRPO on the digit world (cpu scale): replays seeds of `eapo` and `grpo` through the pipeline's own
`paperflow.eapo.stages.train_method` (cpu config, the cpu run's base and pi_E checkpoints) with EAPO's trainer
(`paper_train.eapo_trainer_class`) subclassed to observe every optimiser step, and summarises over steps and seeds:

1. the IS ratio r = pi_theta / mu (TRL's old log-probs, log mu at critical steps) at injected critical tokens, at the
   augmented rows' other tokens and at pure rows' tokens: mean log r, median r, share with r < 1 - eps_low (where
   the clipped surrogate scales the gradient by r for A > 0 and drops it for A < 0);
2. rewards and group advantages of augmented vs pure rows, and the advantage pure rows' correct answers get;
3. per token class, the share of sum |A| r, of the active-gradient weight |A| r (unclipped branch), and of the loss
   gradient's norm (autograd on the class's terms of the clipped surrogate), before and after grad clipping.

Checks that each replay's greedy-accuracy curve equals the cpu run's; checkpoints go to a temporary folder. Writes
tools/measure/eapo_injection_probe.md. Usage, from the repository root (~75 s on 2 cores):
  .venv/bin/python tools/measure/eapo_injection_probe.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from paperflow.core.config import load_paper_config
from paperflow.eapo import paper_train, stages

RESULTS = Path("results/cpu/eapo")
CLASSES = ("injected", "aug_other", "pure")


def probe_class(original, runs: list[dict]):
    """`original` (paper_train.eapo_trainer_class) subclassed: the rollout's critical mask, the augmented rows and
    the rewards ride along in the batch (TRL shuffles rows before the loss); the loss's pi_theta log-probs are kept."""

    def factory():
        base = original()

        class ProbeTrainer(base):
            def _calculate_rewards(self, *args, **kwargs):
                out = super()._calculate_rewards(*args, **kwargs)
                self._probe_reward = out.detach().sum(1)
                return out

            def _generate_and_score_completions(self, inputs):
                roll, seen = self.eapo_rollout, {}

                def take():
                    seen["last"] = type(roll).take(roll)
                    return seen["last"]

                roll.take = take
                try:
                    out = super()._generate_and_score_completions(inputs)
                finally:
                    del roll.take
                comp = out["completion_ids"]
                rows = torch.arange(comp.shape[0], device=comp.device)
                out["probe_critical"] = paper_train._pad(seen["last"]["critical"], comp.shape[1], False, comp.device)
                out["probe_augmented"] = (rows % roll.s.group_size < roll.s.g_aug) & bool(roll.m.inject)
                out["probe_reward"] = self._probe_reward
                return out

            def _get_per_token_logps_and_entropies(self, *args, **kwargs):
                out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
                if getattr(self, "_probe_grab", False):
                    self._probe_logps = out[0]  # with its graph: observe() takes per-class gradients
                return out

            def _compute_loss(self, model, inputs):
                self._probe_grab = True
                try:
                    loss = super()._compute_loss(model, inputs)
                finally:
                    self._probe_grab = False
                runs[-1].setdefault("trainer", self)
                runs[-1]["steps"].append(observe(self, model, inputs, self._probe_logps))
                self._probe_logps = None
                return loss

        return ProbeTrainer

    return factory


def observe(trainer, model, inputs, logps: torch.Tensor) -> dict:
    """One step's token and row arrays (numpy), rows in TRL's shuffled order, and the norms of the gradients of the
    clipped surrogate's terms of each token class (dapo: sum over tokens / num_items_in_batch, TRL's loss)."""
    mask = inputs["completion_mask"].bool()
    old = inputs.get("old_per_token_logps")
    grad_logr = logps - (logps.detach() if old is None else old)
    adv = inputs["advantages"].float()[:, None].expand_as(grad_logr)
    lo, hi = 1 - trainer.epsilon_low, 1 + trainer.epsilon_high
    ratio = grad_logr.exp()
    term = -torch.min(ratio * adv, ratio.clamp(lo, hi) * adv) / inputs["num_items_in_batch"]
    logr, r = grad_logr.detach().float(), ratio.detach()
    active = r * adv <= r.clamp(lo, hi) * adv  # the unclipped branch is the min: gradient A * r flows
    aug = inputs["probe_augmented"].bool()[:, None].expand_as(mask)
    crit = inputs["probe_critical"].bool() & mask
    cls = {"injected": crit, "aug_other": aug & mask & ~crit, "pure": ~aug & mask}
    correct = (inputs["probe_reward"] > 0.5)[:, None].expand_as(mask)
    tok = {k: {"logr": logr[m], "adv": adv[m], "active": active[m], "correct": correct[m]} for k, m in cls.items()}
    params = [p for p in model.parameters() if p.requires_grad]
    grads = {}
    for k, m in {**cls, "all": mask}.items():
        g = torch.autograd.grad(term[m].sum(), params, retain_graph=True, allow_unused=True)
        grads[k] = torch.cat([(x if x is not None else torch.zeros_like(p)).flatten() for x, p in zip(g, params)])
    norm = {k: float(g.norm()) if k == "all" or cls[k].any() else float("nan") for k, g in grads.items()}
    cos = {k: float(grads[k] @ grads["all"]) / max(norm[k] * norm["all"], 1e-30) for k in CLASSES}
    return {
        "grad_norm": norm,
        "grad_cos_all": cos,
        "max_grad_norm": float(trainer.args.max_grad_norm),
        "tokens": {k: {f: v.cpu().numpy() for f, v in d.items()} for k, d in tok.items()},
        "n_tokens": int(mask.sum()),
        "reward": inputs["probe_reward"].float().cpu().numpy(),
        "adv": inputs["advantages"].float().cpu().numpy(),
        "augmented": inputs["probe_augmented"].bool().cpu().numpy(),
        "lo": lo,
    }


def summarise_run(steps: list[dict], history: list[dict]) -> dict:
    """Pooled over the run's steps."""
    out: dict = {}
    cat = {
        k: {f: np.concatenate([s["tokens"][k][f] for s in steps]) for f in ("logr", "adv", "active", "correct")}
        for k in CLASSES
    }
    lo = steps[0]["lo"]
    weight = {k: np.abs(c["adv"]) * np.exp(c["logr"]) for k, c in cat.items()}
    total_w = sum(w.sum() for w in weight.values())
    total_a = sum((w * cat[k]["active"]).sum() for k, w in weight.items())
    for k, c in cat.items():
        r, n = np.exp(c["logr"]), len(c["logr"])
        pos = c["adv"] > 0
        out[k] = {
            "tokens_per_step": n / len(steps),
            "mean_log_r": float(c["logr"].mean()) if n else float("nan"),
            "median_r": float(np.median(r)) if n else float("nan"),
            "share_r_below_1-eps_low": float((r < lo).mean()) if n else float("nan"),
            "mean_r_where_A>0": float(r[pos].mean()) if pos.any() else float("nan"),
            "share_A>0": float(pos.mean()) if n else float("nan"),
            "share_of_sum_absA_r": float(weight[k].sum() / total_w) if total_w else float("nan"),
            "share_of_active_absA_r": float((weight[k] * c["active"]).sum() / total_a) if total_a else float("nan"),
        }
    # per step: the active gradient weight on the policy's own correct answers (pure rows, A > 0), divided by the
    # step's token count as in the loss (dapo: token mean over the batch)
    own = []
    for s in steps:
        p = s["tokens"]["pure"]
        w = np.abs(p["adv"]) * np.exp(p["logr"]) * p["active"]
        own.append(w[p["correct"] & (p["adv"] > 0)].sum() / s["n_tokens"])
    reward, adv, aug = (np.concatenate([s[f] for s in steps]) for f in ("reward", "adv", "augmented"))
    rows = {"augmented": aug, "pure": ~aug}
    for k, m in rows.items():
        ok = m & (reward > 0.5)
        out[f"rows_{k}"] = {
            "rows_per_step": m.sum() / len(steps),
            "reward": float(reward[m].mean()) if m.any() else float("nan"),
            "mean_adv": float(adv[m].mean()) if m.any() else float("nan"),
            "mean_adv_correct": float(adv[ok].mean()) if ok.any() else float("nan"),
            "mean_adv_wrong": float(adv[m & ~ok].mean()) if (m & ~ok).any() else float("nan"),
        }
    out["own_correct_weight_per_step"] = float(np.mean(own))
    for k in CLASSES:  # per step: ||grad of the class's terms|| / ||grad of all||, its cosine with the whole
        out[k]["grad_norm_share"] = float(np.mean([s["grad_norm"][k] / s["grad_norm"]["all"] for s in steps]))
        out[k]["grad_cos_with_all"] = float(np.mean([s["grad_cos_all"][k] for s in steps]))
        clip = [min(1.0, s["max_grad_norm"] / s["grad_norm"]["all"]) * s["grad_norm"][k] for s in steps]
        out[k]["grad_norm_after_clip"] = float(np.mean(clip))
    out["probe_grad_norm_all"] = float(np.mean([s["grad_norm"]["all"] for s in steps]))
    norms = np.array([h["grad_norm"] for h in history if "grad_norm" in h], dtype=float)
    out["grad_norm_mean"] = float(norms.mean()) if len(norms) else float("nan")
    out["share_steps_grad_norm>1"] = float((norms > 1).mean()) if len(norms) else float("nan")
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in d.items():
        out |= flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": float(v)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=["eapo", "grpo"])
    ap.add_argument("--out", default="tools/measure/eapo_injection_probe.md")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a pipeline job with threads 1
    cfg = load_paper_config("eapo", "cpu")
    if float(cfg["eapo"]["alpha"]) != 1.0:
        raise SystemExit(f"eapo.alpha is {cfg['eapo']['alpha']}: the probe reads injected = critical, true at 1.0")
    params = {k: cfg[k] for k in ("rl", "eapo", "prior")}
    runs: list[dict] = []
    paper_train.eapo_trainer_class = probe_class(paper_train.eapo_trainer_class, runs)
    table, replay, start = [], [], time.perf_counter()
    for method in args.methods:
        stored = pd.read_csv(RESULTS / "models" / method / "curves.csv")
        for seed in args.seeds:
            runs.append({"steps": []})
            with tempfile.TemporaryDirectory() as tmp:
                curves, _ = stages.train_method(
                    method,
                    cfg["task"],
                    str(RESULTS / "raw" / "test_problems.parquet"),
                    str(RESULTS / "models" / "base.safetensors"),
                    str(RESULTS / "models" / "prior.safetensors"),
                    params,
                    [seed],
                    {seed: f"{tmp}/seed{seed}.safetensors"},
                )
            run = runs[-1]
            summary = flatten(summarise_run(run["steps"], run["trainer"].state.log_history))
            table.append({"method": method, "seed": seed, **summary})
            ours = curves.dropna(subset=["test_accuracy"])["test_accuracy"].to_numpy()
            theirs = stored[stored.seed == seed].dropna(subset=["test_accuracy"])["test_accuracy"].to_numpy()
            same = np.array_equal(ours, theirs)
            replay.append(
                f"{method} seed {seed}: greedy accuracy curve equals the cpu run's: {same} "
                f"(final {ours[-1]:.3f} vs {theirs[-1]:.3f})"
            )
            runs[-1] = {}  # free the arrays
            print(replay[-1], f"[{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)
    frame = pd.DataFrame(table)
    agg = frame.drop(columns="seed").groupby("method", sort=False).agg(["mean", "min", "max"])
    cols = [c for c in dict.fromkeys(c for c, _ in agg.columns) if not agg[c]["mean"].isna().all()]
    lines = [
        "# EAPO injection probe (cpu scale)",
        "",
        f"Command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}; machine: {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} CPUs, torch threads 1); "
        f"runtime {time.perf_counter() - start:.0f} s  ",
        f"Config: config/eapo.yaml cpu ({cfg['rl']['steps']} steps, G {cfg['rl']['group_size']}, g_aug "
        f"{cfg['eapo']['g_aug']}, alpha {cfg['eapo']['alpha']}, eps {cfg['rl']['eps_low']}/{cfg['rl']['eps_high']}); "
        f"seeds {args.seeds}; checkpoints {RESULTS}/models/{{base,prior}}.safetensors",
        "",
        "Token classes: `injected` = critical steps of augmented rows (all injected at alpha 1), `aug_other` = the "
        "augmented rows' other tokens, `pure` = the other rows (all rows for grpo). r = pi_theta / old, old = log mu "
        "at critical steps, pi_old elsewhere. `share_of_active_absA_r`: |A| r where the unclipped branch is the min "
        "(the token's gradient coefficient). `own_correct_weight_per_step`: that weight summed over pure correct "
        "tokens with A > 0, divided by the step's token count (the dapo loss's normaliser). `grad_norm_share`: per "
        "step, the norm of the gradient of that class's terms of the clipped surrogate over the whole loss's gradient "
        "norm (`probe_grad_norm_all`; TRL's logged pre-clip norm is `grad_norm_mean`); `grad_norm_after_clip`: the "
        "class's gradient norm after the step's clipping to rl.grad_clip; `grad_cos_with_all`: its cosine with the "
        "whole gradient.",
        "",
        "## Replay check",
        "",
        *[f"- {x}" for x in replay],
        "",
        "## Summary: mean over seeds [min, max]",
        "",
        "| metric | " + " | ".join(agg.index) + " |",
        "|---|" + "---|" * len(agg.index),
    ]
    for c in cols:
        cells = [
            f"{agg.loc[m, (c, 'mean')]:.4g} [{agg.loc[m, (c, 'min')]:.3g}, {agg.loc[m, (c, 'max')]:.3g}]"
            for m in agg.index
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "## Per seed (JSON)", "", "```json", frame.to_json(orient="records", indent=1), "```", ""]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
