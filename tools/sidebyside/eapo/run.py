"""Side by side (spec 10.6): the advantages and policy loss every eapo arm trains with against verl's and LUFFY's,
on the same fixed tensors.

Ours: every TRL arm (smoke, cpu and paper scale) trains with `paperflow.eapo.paper_train.eapo_trainer_class()`,
TRL's GRPOTrainer whose old log-probs are the recorded behaviour log-probs log mu at EAPO's critical steps. Its
loss is `EAPOTrainer._compute_loss` itself, called on a tiny model's trainer with the settings the pipeline gives
it (`paperflow.eapo.stages.grpo_args`: loss_type dapo = token-mean, eps 0.2/0.28, beta 0) and fed a fixed per-token
log-prob tensor in place of the policy's forward (its `_get_per_token_logps_and_entropies` returns the tensor), so
the value and the gradient with respect to the log-probs come from the trainer's real code path. TRL's group
advantages (scale_rewards group: Bessel std, eps 1e-4) are `paperflow.core.lm.losses.group_advantages` with
unbiased=True, eps=1e-4 (checked equal to TRL's in the kit's tests).

Official: verl (github.com/volcengine/verl, verl/trainer/ppo/core_algos.py: compute_grpo_outcome_advantage,
agg_loss, compute_policy_loss (deprecated alias), compute_policy_loss_vanilla, compute_policy_loss_clip_cov;
verl/utils/torch_functional.py: masked_sum, masked_mean) and LUFFY (github.com/ElliottYan/LUFFY,
luffy/verl/verl/mix_src/mix_core_alg.py: compute_token_on_off_policy_loss, compute_grpo_outcome_advantage_split;
luffy/verl/verl/trainer/ppo/core_algos.py: compute_grpo_outcome_advantage; luffy/verl/verl/utils/
torch_functional.py: masked_mean). Neither package is installed here and neither imports without its stack
(omegaconf, tensordict, ray, ...), so the functions are taken by name from the checkouts' files with `ast`,
their decorators (verl's registries, @deprecated) dropped, and compiled unchanged into a namespace holding torch,
numpy, defaultdict and a `verl_F` made of the checkout's own masked_sum / masked_mean. Nothing of them is copied.

Usage (from the repository root; no network, no GPU):

    git --git-dir=/work/.mirror/volcengine+verl/repo archive <commit> | tar -x -C /tmp/eapo_verl
    git --git-dir=/work/.mirror/ElliottYan+LUFFY/repo archive <commit> luffy | tar -x -C /tmp/eapo_luffy
    .venv/bin/python tools/sidebyside/eapo/run.py --verl /tmp/eapo_verl --luffy /tmp/eapo_luffy \
        --verl-commit <commit> --luffy-commit <commit> --out workflows/eapo/sidebyside.md \
        [--readme workflows/eapo/README.md]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from paperflow.core.lm.losses import group_advantages

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

TOL = 1e-6
N_GROUPS, G, T = 4, 4, 12
EPS_LOW, EPS_HIGH, ADV_EPS, GAMMA = 0.2, 0.28, 1e-6, 0.1


# -- loading the official functions -----------------------------------------------------------------------------
def compile_functions(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """The top-level functions `names` of `path`, decorators dropped, compiled into `namespace`."""
    tree = ast.parse(path.read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = sorted(set(names) - {f.name for f in funcs})
    if missing:
        raise SystemExit(f"{path}: no top-level function(s) {missing}")
    for f in funcs:
        f.decorator_list = []
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), namespace)
    return {n: namespace[n] for n in names}


def load(root: Path, package: str, torch_functional: tuple[str, ...], files: dict[str, tuple[str, ...]]):
    """Compile the named functions of `files` (paths under root/package) into one namespace with a verl_F stub."""
    stub_types = {"AlgoConfig": type("AlgoConfig", (), {}), "ActorConfig": type("ActorConfig", (), {})}
    base = {"torch": torch, "np": np, "defaultdict": defaultdict, "Optional": Optional, "Any": Any, **stub_types}
    vf_ns = dict(base)
    vf = compile_functions(root / package / "utils/torch_functional.py", torch_functional, vf_ns)
    ns = {**base, "verl_F": types.SimpleNamespace(**vf)}
    out = {}
    for rel, names in files.items():
        out.update(compile_functions(root / package / rel, names, ns))
    return out


class ActorCfg(dict):
    """What verl's policy losses read of an ActorConfig (attributes, `.get`, global_batch_info, policy_loss)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.__dict__.update(kw)


def actor_config(clip_ratio_c=3.0, clip_cov_lb=1.0, clip_cov_ub=5.0, clip_cov_ratio=0.0002):
    pl = types.SimpleNamespace(clip_cov_ratio=clip_cov_ratio, clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub)
    return ActorCfg(
        clip_ratio=EPS_LOW,
        clip_ratio_low=EPS_LOW,
        clip_ratio_high=EPS_HIGH,
        clip_ratio_c=clip_ratio_c,
        global_batch_info={},
        policy_loss=pl,
    )


# -- the fixed tensors ------------------------------------------------------------------------------------------
def tensors(seed: int, spread: float):
    """N = groups x G rollouts of T tokens: lengths 3..T, binary rewards (group 0 all correct: A = 0), behaviour
    log-probs in [-3, -0.05], current log-probs = behaviour + U(-spread, spread), injected tokens on the first
    row of each group (about 30% of its tokens) with log mu as behaviour log-prob."""
    g = torch.Generator().manual_seed(seed)
    n = N_GROUPS * G
    lengths = torch.randint(3, T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = (torch.rand(n, generator=g) < 0.5).float()
    rewards[:G] = 1.0
    old = -0.05 - 2.95 * torch.rand(n, T, generator=g)
    logp = old + spread * (2 * torch.rand(n, T, generator=g) - 1)
    first = (torch.arange(n) % G) == 0
    injected = first[:, None] & mask & (torch.rand(n, T, generator=g) < 0.3)
    return {"mask": mask, "rewards": rewards, "old": old * mask, "logp": logp * mask, "injected": injected}


def token_rewards(rewards, mask):
    """verl's token_level_rewards: the outcome reward on each response's last token."""
    out = torch.zeros(mask.shape)
    last = mask.long().sum(1) - 1
    out[torch.arange(len(rewards)), last] = rewards
    return out


# -- ours -------------------------------------------------------------------------------------------------------
TRL_EPS = 1e-4  # TRL's advantage epsilon (scale_rewards group)


def trl_trainer():
    """The pipeline's EAPOTrainer on a tiny digit-world model, with the smoke settings' loss (token-mean, clip
    0.2/0.28, beta 0), G rows per group and N_GROUPS x G rows per step."""
    import tempfile

    from datasets import Dataset

    from paperflow.core.lm.models import build_model
    from paperflow.eapo import paper_train, stages
    from paperflow.eapo.task import AdditionTask

    task = AdditionTask(2)
    rl_cfg = {
        "prompts_per_step": N_GROUPS,
        "group_size": G,
        "lr": 1e-4,
        "eps_low": EPS_LOW,
        "eps_high": EPS_HIGH,
        "temperature": 1.0,
        "ppo_epochs": 1,
        "grad_clip": 1.0,
    }
    spec = {
        "arch": "qwen2",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 16,
        "vocab_size": len(task.vocab),
    }
    eapo = {
        "g_aug": 1,
        "alpha": 1.0,
        "quantile": 0.8,
        "ema": 0.9,
        "critical_rule": "entropy",
        "is_mode": "mixture_clip",
        "random_rate": 0.2,
    }
    trainer = paper_train.trainer(
        method="eapo",
        eapo=eapo,
        rollout={"batch_rows": N_GROUPS * G},
        seed=0,
        args=stages.grpo_args(rl_cfg, task, 1, 0, 1e-4, tempfile.mkdtemp()),
        policy=build_model(spec, 0).train(),
        prior=build_model(spec, 1),
        tokenizer=task.tokenizer,
        dataset=Dataset.from_list([{"prompt": "x"}]),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def ours_loss(trainer, logp, old, adv, mask, loss_type="dapo"):
    """(loss, d loss / d logp) of EAPOTrainer._compute_loss with `old` as the old (behaviour) log-probs."""
    leaf = logp.clone().requires_grad_(True)
    n, width = mask.shape
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, torch.zeros_like(leaf), None)
    trainer.loss_type, trainer.max_completion_length = loss_type, width
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, width, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum().float(),
    }
    loss = trainer._compute_loss(trainer.model, inputs)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def theirs(fn, old, logp, *args, **kw):
    """(value, d value / d logp) of an official loss called as fn(old_log_prob, log_prob, *args, **kw)."""
    leaf = logp.clone().requires_grad_(True)
    with contextlib.redirect_stdout(io.StringIO()):  # LUFFY prints when clip_upper_bound is used
        out = fn(old, leaf, *args, **kw)
    loss = out[0] if isinstance(out, tuple) else out["pg_loss"] if isinstance(out, dict) else out
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def diff(a, b):
    return float((a - b).abs().max())


# -- the comparisons --------------------------------------------------------------------------------------------
def compare(verl, luffy, seed: int):
    rows = []

    def row(what, official, settings, pair_value, pair_grad=None, expect="match", why=""):
        dv = diff(*pair_value)
        dg = diff(*pair_grad) if pair_grad is not None else float("nan")
        worst = dv if pair_grad is None else max(dv, dg)
        rows.append(
            {
                "comparison": what,
                "official": official,
                "settings": settings,
                "max |d value|": dv,
                "max |d grad|": dg,
                "result": "match" if worst <= TOL else "differs",
                "expected": expect,
                "why": why,
            }
        )

    x = tensors(seed, spread=0.35)  # ratios about exp(+-0.35): both clip bounds crossed, none past 3
    mask, maskf, rewards = x["mask"], x["mask"].float(), x["rewards"]
    index = np.repeat(np.arange(N_GROUPS), G)
    tlr = token_rewards(rewards, mask)

    # advantages: TRL's (scale_rewards group) are Bessel-std with eps 1e-4; verl's and LUFFY's with their epsilon
    adv = group_advantages(rewards, G, eps=TRL_EPS, unbiased=True)
    v_adv, _ = verl["compute_grpo_outcome_advantage"](tlr, maskf, index, epsilon=TRL_EPS)
    l_adv, _ = luffy["compute_grpo_outcome_advantage"](tlr, maskf, index, epsilon=TRL_EPS)
    v_adv6, _ = verl["compute_grpo_outcome_advantage"](tlr, maskf, index, epsilon=1e-6)
    tok = lambda a: a[:, None] * maskf  # noqa: E731
    row(
        "GRPO advantages (as TRL computes them)",
        "verl compute_grpo_outcome_advantage",
        "epsilon 1e-4 on both",
        (tok(adv), v_adv),
    )
    row(
        "GRPO advantages (as TRL computes them)",
        "LUFFY compute_grpo_outcome_advantage",
        "epsilon 1e-4 on both",
        (tok(adv), l_adv),
    )
    row(
        "GRPO advantages (as TRL computes them)",
        "verl compute_grpo_outcome_advantage",
        "verl epsilon 1e-6",
        (tok(adv), v_adv6),
        expect="differs",
        why="TRL adds 1e-4 to the std, verl's default 1e-6",
    )
    on_policy = torch.ones(len(rewards), dtype=torch.bool)
    on_policy[::G] = False  # LUFFY's off-policy trace: the first row of each group
    s_adv, _ = luffy["compute_grpo_outcome_advantage_split"](tlr, maskf, index, on_policy, epsilon=TRL_EPS)
    row(
        "LUFFY advantages, grpo_split",
        "LUFFY compute_grpo_outcome_advantage_split",
        "trace = row 0 of each group",
        (tok(adv), s_adv),
        expect="differs",
        why="grpo_split takes mean/std over the on-policy rows only (and std 0 -> 1); TRL over all G rows",
    )

    trainer = trl_trainer()
    advt = tok(adv)
    logp, old = x["logp"], x["old"]

    # GRPO: token-mean clipped surrogate (TRL loss_type dapo), clip-higher
    ours_v, ours_g = ours_loss(trainer, logp, old, adv, mask)
    vv = theirs(verl["compute_policy_loss_vanilla"], old, logp, advt, maskf, "token-mean", actor_config())
    row(
        "GRPO clipped surrogate, token-mean",
        "verl compute_policy_loss_vanilla",
        "eps 0.2/0.28, clip_ratio_c 3, loss_agg_mode token-mean",
        (ours_v, vv[0]),
        (ours_g, vv[1]),
    )
    # the deprecated alias: old, logp, adv, mask, cliprange, low, high, c, mode
    vd = theirs(verl["compute_policy_loss"], old, logp, advt, maskf, EPS_LOW, EPS_LOW, EPS_HIGH, 3.0, "token-mean")
    row(
        "GRPO clipped surrogate, token-mean",
        "verl compute_policy_loss (deprecated alias)",
        "cliprange 0.2, low 0.2, high 0.28, clip_ratio_c 3",
        (ours_v, vd[0]),
        (ours_g, vd[1]),
    )

    # EAPO's mixture IS: EAPOTrainer's old log-probs are log mu at the injected (critical) tokens
    inj = x["injected"]
    mu = torch.where(inj, old + 0.5 * torch.rand(old.shape, generator=torch.Generator().manual_seed(seed)), old)
    ours_v, ours_g = ours_loss(trainer, logp, mu, adv, mask)
    ve = theirs(verl["compute_policy_loss_vanilla"], mu, logp, advt, maskf, "token-mean", actor_config())
    row(
        "EAPO mixture IS (old = log mu at injected tokens)",
        "verl compute_policy_loss_vanilla",
        "old_log_prob := recorded behaviour log-probs; token-mean",
        (ours_v, ve[0]),
        (ours_g, ve[1]),
    )

    # dual clip: ratios past clip_ratio_c with negative advantages
    y = tensors(seed + 1, spread=2.0)
    ours_v, ours_g = ours_loss(trainer, y["logp"], y["old"], adv, y["mask"])
    vy = theirs(
        verl["compute_policy_loss_vanilla"],
        y["old"],
        y["logp"],
        adv[:, None] * y["mask"],
        y["mask"].float(),
        "token-mean",
        actor_config(),
    )
    row(
        "clipped surrogate, ratios up to e^2",
        "verl compute_policy_loss_vanilla",
        "clip_ratio_c 3 (verl's default)",
        (ours_v, vy[0]),
        (ours_g, vy[1]),
        expect="differs",
        why="verl's dual clip caps -A*ratio at -3A for A < 0; TRL's loss has no dual clip",
    )
    vy = theirs(
        verl["compute_policy_loss_vanilla"],
        y["old"],
        y["logp"],
        adv[:, None] * y["mask"],
        y["mask"].float(),
        "token-mean",
        actor_config(clip_ratio_c=1e9),
    )
    row(
        "clipped surrogate, ratios up to e^2",
        "verl compute_policy_loss_vanilla",
        "clip_ratio_c 1e9 (dual clip off)",
        (ours_v, vy[0]),
        (ours_g, vy[1]),
    )

    # clip-cov
    cc = theirs(
        verl["compute_policy_loss_clip_cov"],
        old,
        logp,
        advt,
        maskf,
        "token-mean",
        actor_config(clip_cov_lb=1e9, clip_cov_ub=1e9),
    )
    ours_v, ours_g = ours_loss(trainer, logp, old, adv, mask)
    row(
        "clipped surrogate vs Clip-Cov",
        "verl compute_policy_loss_clip_cov",
        "empty covariance window (lb = ub = 1e9): no token detached",
        (ours_v, cc[0]),
        (ours_g, cc[1]),
    )
    torch.manual_seed(seed)
    cc = theirs(
        verl["compute_policy_loss_clip_cov"],
        old,
        logp,
        advt,
        maskf,
        "token-mean",
        actor_config(clip_cov_lb=-1e9, clip_cov_ub=1e9, clip_cov_ratio=0.2),
    )
    row(
        "clipped surrogate vs Clip-Cov",
        "verl compute_policy_loss_clip_cov",
        "window (-1e9, 1e9), clip_cov_ratio 0.2",
        (ours_v, cc[0]),
        (ours_g, cc[1]),
        expect="differs",
        why="Clip-Cov zeroes the loss of a random 20% of unclipped tokens; eapo has no Clip-Cov",
    )

    # TRL's other aggregations (not eapo's) against verl's
    for loss_type, verl_mode, expect, why in (
        ("grpo", "seq-mean-token-mean", "match", ""),
        (
            "dr_grpo",
            "seq-mean-token-sum-norm",
            "differs",
            "verl divides the token sum by loss_scale_factor (= T) only; TRL's dr_grpo by N x T",
        ),
    ):
        lo, go = ours_loss(trainer, logp, old, adv, mask, loss_type=loss_type)
        va = theirs(verl["compute_policy_loss_vanilla"], old, logp, advt, maskf, verl_mode, actor_config())
        row(
            f"aggregation: TRL loss_type {loss_type}",
            f"verl agg_loss {verl_mode}",
            "via compute_policy_loss_vanilla",
            (lo, va[0]),
            (go, va[1]),
            expect=expect,
            why=why,
        )

    # LUFFY's token loss with no off-policy trace (prefix_mask empty) is the clipped surrogate, token-mean
    none = torch.zeros_like(mask)
    ours_v, ours_g = ours_loss(trainer, logp, old, adv, mask)
    lf = theirs(
        luffy["compute_token_on_off_policy_loss"],
        old,
        logp,
        advt,
        maskf,
        cliprange=EPS_LOW,
        clip_upper_bound=1 + EPS_HIGH,
        prefix_mask=none,
        off_cliprange=None,
        off_policy_reshape="p_div_p_0.1",
    )
    row(
        "on-policy part of LUFFY's loss (no trace)",
        "LUFFY compute_token_on_off_policy_loss",
        "prefix_mask empty, cliprange 0.2, clip_upper_bound 1.28",
        (ours_v, lf[0]),
        (ours_g, lf[1]),
    )
    return rows


def table(rows, verl_commit, luffy_commit, seed) -> str:
    head = (
        f"Generated by `tools/sidebyside/eapo/run.py` (seed {seed}; {N_GROUPS} groups x G = {G}, T = {T}, float32; "
        f"tolerance {TOL:g}). verl at `{verl_commit}`, LUFFY at `{luffy_commit}`. Gradients are d loss / d log-prob.\n\n"
        "| comparison | official | settings | max abs diff (value) | max abs diff (grad) | result | expected | why |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['comparison']} | {r['official']} | {r['settings']} | {r['max |d value|']:.3g} | "
        f"{r['max |d grad|']:.3g} | {r['result']} | {r['expected']} | {r['why']} |\n"
        for r in rows
    )
    unexpected = [r["comparison"] for r in rows if r["result"] != r["expected"]]
    tail = "\nEvery result is as expected.\n" if not unexpected else f"\nUNEXPECTED: {unexpected}\n"
    return head + body + tail


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verl", type=Path, required=True, help="checkout of volcengine/verl")
    ap.add_argument("--luffy", type=Path, required=True, help="checkout of ElliottYan/LUFFY")
    ap.add_argument("--verl-commit", required=True)
    ap.add_argument("--luffy-commit", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--readme", type=Path)
    a = ap.parse_args(argv)
    verl = load(
        a.verl,
        "verl",
        ("masked_sum", "masked_mean"),
        {
            "trainer/ppo/core_algos.py": (
                "compute_grpo_outcome_advantage",
                "agg_loss",
                "compute_policy_loss",
                "compute_policy_loss_vanilla",
                "compute_policy_loss_clip_cov",
            )
        },
    )
    luffy = load(
        a.luffy / "luffy/verl",
        "verl",
        ("masked_mean",),
        {
            "mix_src/mix_core_alg.py": ("compute_token_on_off_policy_loss", "compute_grpo_outcome_advantage_split"),
            "trainer/ppo/core_algos.py": ("compute_grpo_outcome_advantage",),
        },
    )
    text = table(compare(verl, luffy, a.seed), a.verl_commit, a.luffy_commit, a.seed)
    a.out.write_text(text)
    print(text)
    if a.readme:
        splice(a.readme, "sidebyside", text)


if __name__ == "__main__":
    main()
