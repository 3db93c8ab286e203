"""promptscale's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices, require_keys
from paperflow.core.lm.models import model_config

GATED_VARIANTS = ("em", "randomk", "randomk2")  # the primary claims, section 11's control and its replicate
PAPER_KEYS = (
    "models",
    "corpora",
    "benchmarks",
    "seeds_data",
    "vllm",
    "llm_em",
    "sft",
    "llm_synthesis",
    "llm_eval",
    "selfplay",
    "dpo",
    "code_benchmarks",
    "code_eval",
    "sft_arm",
)


def check(cfg: dict[str, Any], source: str) -> None:
    """The model spec is one the kit builds and holds the longest sequence; M >= K; the gated variants run and the
    solvers train on EM's and random-of-K's problems; the report-only seeds are among the seeds."""
    model_config({**cfg["model"], "vocab_size": 40})  # refuses a misspelt model key by name
    em = cfg["em"]
    if em["evaluation"]["m"] < em["k"]:
        raise ConfigError(f"{source}: em.evaluation.m ({em['evaluation']['m']}) must be >= em.k ({em['k']})")
    longest = 1 + 1 + 3 + 1 + 13 + 1 + em["max_plan"] + 1  # bos <c> c.. <x> x.. <z> z.. eos (q's template)
    if cfg["model"].get("max_position_embeddings", 10**9) < longest:
        raise ConfigError(f"{source}: model.max_position_embeddings is below the longest sequence ({longest})")
    require_choices(cfg["variants"], source=source, key="variants", required=GATED_VARIANTS)
    require_choices(
        cfg["solver"]["synthetic"],
        source=source,
        key="solver.synthetic",
        known=[*cfg["variants"], "coldstart"],
        required=("em", "randomk"),
        noun="prompt model",
    )
    extra = [s for s in cfg["report_seeds"] if s not in cfg["seeds"]]
    if extra:
        raise ConfigError(f"{source}: report_seeds {extra} are not in seeds {cfg['seeds']}")
    if cfg["source"]["kind"] == "official":
        check_paper(cfg, source)


def check_paper(cfg: dict[str, Any], source: str) -> None:
    """Paper scale: every paper key present; the seed corpus in PromptCoT 1.0's triple format and every benchmark a
    benchmark-format corpus; TRL's SFT keys (paperflow.promptscale.sft); vLLM's tensor parallelism within the GPUs
    a generation job asks for."""
    from paperflow.promptscale.annotate import check_settings as check_code_seeds
    from paperflow.promptscale.code_eval import check_limits
    from paperflow.promptscale.code_selfplay import check_paper as check_code_selfplay
    from paperflow.promptscale.codeforces import check_paper as check_codeforces
    from paperflow.promptscale.dpo import check_settings as check_dpo
    from paperflow.promptscale.llm_text import BENCHMARK_FORMATS, CODE_FORMATS, SFT_FORMATS
    from paperflow.promptscale.sft import check_settings

    require_keys(cfg, PAPER_KEYS, f"{source} (source.kind official)")
    corpora = cfg["corpora"]
    if corpora["seeds"]["format"] != "promptcot_triples":
        raise ConfigError(
            f"{source}: corpora.seeds.format must be promptcot_triples, got {corpora['seeds']['format']!r}"
        )
    for name in cfg["benchmarks"]:
        if name not in corpora:
            raise ConfigError(f"{source}: benchmark {name!r} has no entry in corpora (it has {sorted(corpora)})")
        if corpora[name]["format"] not in BENCHMARK_FORMATS:
            raise ConfigError(
                f"{source}: corpora.{name}.format = {corpora[name]['format']!r}: a benchmark is one of {BENCHMARK_FORMATS}"
            )
    for name in cfg["code_benchmarks"]:
        if corpora.get(name, {}).get("format") not in CODE_FORMATS:
            raise ConfigError(
                f"{source}: code benchmark {name!r} needs a corpora entry of format one of {CODE_FORMATS}"
            )
        if "window" not in corpora[name]:
            raise ConfigError(f"{source}: corpora.{name}.window (the [start, end) contest dates) is missing")
    check_limits(cfg["code_eval"], f"{source}: code_eval")
    check_settings(cfg["sft"], f"{source}: sft")
    check_settings(cfg["sft_arm"], f"{source}: sft_arm")
    if corpora.get("sft_traces", {}).get("format") not in SFT_FORMATS:
        raise ConfigError(f"{source}: corpora.sft_traces (the SFT arm's traces) needs a format of {SFT_FORMATS}")
    check_dpo(cfg["dpo"], f"{source}: dpo")
    check_code_seeds(cfg, source)  # the code domain (when seeds_data.domains has code): the annotate block,
    check_code_selfplay(cfg, source)  # the unit-test writer and the code_selfplay block
    check_codeforces(cfg, source)  # the Codeforces Elo's block and its CodeElo corpus
    gpus = cfg["resources"].get("sample_gpus", cfg["resources"]["gpus"])
    tp = cfg["vllm"]["tensor_parallel_size"]
    if gpus and tp > gpus:
        raise ConfigError(f"{source}: vllm.tensor_parallel_size ({tp}) exceeds the GPUs of a generation job ({gpus})")


SYNTHETIC_METRICS = (
    "iwae_gain",
    "recovery_gain",
    "validity",
    "consistency",
    "mean_ops",
    "distinct_skeletons",
    "distinct_2",
    "heldout_accuracy",
    "test_accuracy",
)


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metric names of the report's metrics table (paperflow.promptscale.claims / paper_report.metrics_table)."""
    if cfg["source"]["kind"] == "official":
        benchmarks = [*cfg["benchmarks"], *cfg["code_benchmarks"]]
        return ["heldout_bound_gain", "heldout_validity", *(f"{b}/avg_at_k" for b in benchmarks)]
    return list(SYNTHETIC_METRICS)


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The EM variants, prompt models and solvers (`solver_<arm>`) of the synthetic world, or at paper scale EM, the prompt models and the
    evaluated policies."""
    if cfg["source"]["kind"] == "official":
        return ["em", "coldstart", "base", "selfplay", "sft"]
    solvers = [f"solver_{arm}" for arm in ("seeds_only", *cfg["solver"]["synthetic"], "selfplay_dpo")]
    return list(dict.fromkeys([*cfg["variants"], "coldstart", "norationale", *solvers]))
