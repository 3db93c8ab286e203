"""Config rules of st_gfn that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paperflow.core.config import ConfigError, reject_unknown, require_keys, require_member

ENV_NEEDS = {
    "hypergrid": ("ndim", "height", "R0", "R1", "R2"),
    "bitseq": ("word_size", "seq_size", "n_modes", "temperature", "mode_seed", "mode_distance"),
    "geneset": ("source", "k", "min_cells", "n_response_genes", "target", "tau", "n_modes"),
    "tictactoe": ("lambd", "iterations", "batch_size", "eval_every", "eval_games"),
    "connect4": (
        "lambd",
        "iterations",
        "batch_size",
        "eval_every",
        "eval_games",
        "test_positions",
        "test_empty",
        "test_seed",
    ),
}
SOURCE_NEEDS = {"geo": ("base_url", "sha256"), "synthetic_norman": ("synthetic_seed",)}
ENUMERABLE = ("hypergrid", "geneset")  # envs with an exact target (L1 metrics)
GAMES = ("tictactoe", "connect4")  # two-player games (optimal-move and win-rate metrics)

GAME_KEYS = set(ENV_NEEDS["connect4"])
LAM0_METHOD = "st_gfn_lam0"  # the lam = 0 run that the claims compare with DB

NEEDS = {
    "tb": (),
    "db": (),
    "subtb": ("lamda",),
    "st_gfn": (
        "filter",
        "lam",
        "omega_c",
        "order",
        "s0_flow",
        "pad_to_max",
        "length_weighting",
        "time_features",
        "intrinsic",
        "beta0",
        "anneal_fraction",
        "omega_r",
    ),
}


# the keys the library reads from each of these config blocks (the schema lists the same)
KEYS = {
    "model": ("hidden", "layers"),
    "train": ("iterations", "batch_size", "lr", "lr_logz", "epsilon", "grad_clip", "engine"),
    "evaluate": (
        "last_visited",
        "loss_window",
        "n_eval_samples",
        "eval_batch",
        "efficiency_l1",
        "efficiency_stride",
        "top_k",
    ),
}


def known_keys(block: str, cfg: Mapping[str, Any]) -> None:
    """ConfigError when `cfg`, the config block `block`, has a key its library code does not read."""
    reject_unknown(cfg, KEYS[block], block)


def known_method(method: Mapping[str, Any]) -> None:
    """ConfigError when a method spec has a key its kind does not take."""
    reject_unknown(method, ("kind", *NEEDS[method["kind"]]), f"a {method['kind']} method")


def check_env(name: str, spec: dict[str, Any], source: str) -> None:
    kind = spec["kind"]
    needs = ENV_NEEDS[kind] + (SOURCE_NEEDS[spec["source"]] if kind == "geneset" and "source" in spec else ())
    require_keys(spec, needs, f"{source}: envs.{name} (kind {kind})")
    foreign = sorted(k for k in set(spec) & GAME_KEYS if k not in needs)
    if foreign:
        raise ConfigError(
            f"{source}: envs.{name} (kind {kind}) has game key(s) {', '.join(foreign)}; "
            f"a {kind} env takes only: {', '.join(('kind', 'sigma') + needs)}"
        )
    if kind == "bitseq" and spec["seq_size"] % spec["word_size"]:
        raise ConfigError(
            f"{source}: envs.{name}.seq_size = {spec['seq_size']} is not a multiple of word_size = {spec['word_size']}"
        )
    if kind == "bitseq" and spec["mode_distance"] > spec["seq_size"]:
        raise ConfigError(
            f"{source}: envs.{name}.mode_distance = {spec['mode_distance']} exceeds seq_size = {spec['seq_size']}"
        )


def check(cfg: dict[str, Any], source: str) -> None:
    for name, spec in cfg["envs"].items():
        check_env(name, spec, source)
    for name in cfg["run_envs"]:
        require_member(name, cfg["envs"], source, "run_envs[...]")
    if sorted(cfg["env_methods"]) != sorted(cfg["run_envs"]):
        raise ConfigError(
            f"{source}: env_methods has keys {sorted(cfg['env_methods'])} but run_envs is {sorted(cfg['run_envs'])}; give each run env its methods"
        )
    for env, methods in cfg["env_methods"].items():
        for m in methods:
            require_member(m, cfg["methods"], source, f"env_methods.{env}[...]")
    for name, spec in cfg["methods"].items():
        where = f"{source}: methods.{name} (kind {spec['kind']})"
        require_keys(spec, NEEDS[spec["kind"]], where)
        reject_unknown(spec, ("kind", *NEEDS[spec["kind"]]), where)
    for env in cfg["run_envs"]:
        baselines = ("tb", "db") if cfg["envs"][env]["kind"] in ENUMERABLE else ("tb",)
        for name in ("st_gfn",) + baselines:  # the config's claims compare these on every env (reported directions)
            require_member(name, cfg["env_methods"][env], source, f"{name!r} (methods of {env})")
    lam0 = cfg["methods"].get(LAM0_METHOD)
    if lam0 is not None and (lam0["kind"] != "st_gfn" or lam0["lam"] != 0 or lam0["filter"] != "tikhonov"):
        raise ConfigError(
            f"{source}: methods.{LAM0_METHOD} must be an st_gfn method with filter tikhonov and lam 0 (the claims' "
            "lam = 0 run)"
        )
    if cfg["evaluate"]["last_visited"] > cfg["train"]["iterations"] * cfg["train"]["batch_size"]:
        raise ConfigError(
            f"{source}: evaluate.last_visited = {cfg['evaluate']['last_visited']} exceeds the "
            f"{cfg['train']['iterations'] * cfg['train']['batch_size']} trajectories of training"
        )
    if cfg["evaluate"]["loss_window"] > cfg["train"]["iterations"]:
        raise ConfigError(f"{source}: evaluate.loss_window exceeds train.iterations")


# a game env's evaluation metrics (paperflow.st_gfn.game_evaluation), shown by game_report
GAME_METRICS = (
    "optimal_argmax",
    "optimal_sampled",
    "win_rate_vs_random",
    "draw_rate_vs_random",
    "loss_rate_vs_random",
    "win_rate_vs_minimax",
    "draw_rate_vs_minimax",
    "loss_rate_vs_minimax",
)

# the metrics of the long table (paperflow.st_gfn.claims.metrics_table), per env kind, besides the identity gaps
RUN_METRICS = {
    "enumerable": (
        "l1",
        "tv",
        "jsd",
        "modes_found",
        "modes_total",
        "loss_std_last",
        "trajectories_to_l1",
        "l1_on_policy",
        "logz_abs_err",
    ),
    "sequence": ("modes_found", "modes_total", "topk_reward", "topk_diversity", "loss_std_last"),
    "game": (*GAME_METRICS, "loss_std_last"),
}
IDENTITY_METRICS = ("lam0_db_gap", "dc_tb_gap", "db_sum", "tb_loss")
NOISE_GAP_METRIC = "l1_gap_to_db_over_seed_noise"  # claims.seed_noise_gaps: |L1 - L1(db)| / seed noise, per seed
SAMPLER_METHODS = ("uniform", "untrained", "identity", "identity_filtered")  # evaluation's rows beside the runs


def env_family(kind: str) -> str:
    return "game" if kind in GAMES else "enumerable" if kind in ENUMERABLE else "sequence"


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces: "<env>/<metric>" for every run env."""
    names = []
    for env in cfg["run_envs"]:
        family = env_family(cfg["envs"][env]["kind"])
        own = RUN_METRICS[family] + IDENTITY_METRICS
        if family == "enumerable" and "db" in cfg["env_methods"][env]:
            own += (NOISE_GAP_METRIC,)
        names += [f"{env}/{m}" for m in own]
    return names


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods trained on some run env, and the evaluation's samplers and identity rows."""
    return sorted({m for env in cfg["run_envs"] for m in cfg["env_methods"][env]} | set(SAMPLER_METHODS))
