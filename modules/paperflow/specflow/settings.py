"""specflow's methods, budgets and the config rules the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paperflow.core.config import ConfigError, require_choices

N_CLASSES = 5  # the count of objects, 1-5 (label = count - 1); the control's scenes hold one object

# SpecFlow and its ablations (spec section 7 and section 3's ablations): overrides of the `specflow` block
VARIANTS: dict[str, dict[str, Any]] = {
    "specflow": {},
    "specflow_noheat": {"alpha": 0.0},  # no diffusion: E = s
    "specflow_topk": {"allocation": "topk"},  # global Top-K instead of the quadtree
    "specflow_uniform": {"allocation": "uniform"},  # fixed m x m crops
    "specflow_nosink": {"sinks": False},
    "specflow_matched": {"matched": True},  # K - 2 selected + 2 sinks: K tokens fed
    "specflow_attngraph": {"graph": "attn"},  # raw token self-attention graph instead of the kNN feature graph
}
BASELINE_METHODS = ("full", "random", "uniform_pool", "topk", "hired", "visionzip", "prumerge", "tome", "divprune")
METHODS = (*BASELINE_METHODS, "fastv", *VARIANTS)
# the gated claims compare these (spec sections 7 and 11)
GATED = ("full", "random", "topk", "fastv", "specflow", "specflow_noheat", "specflow_topk")
# at paper scale (source.kind llava) the claims compare these (FastV runs there too, inside the LLM: llava.py)
PAPER_GATED = ("full", "topk", "visionzip", "specflow")


def method_kind(method: str) -> str:
    if method in VARIANTS:
        return "specflow"
    if method == "fastv":
        return "fastv"
    if method in BASELINE_METHODS:
        return "baseline"
    raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def specflow_config(method: str, cfg: Mapping[str, Any]):
    from paperflow.specflow.specflow import SpecFlowConfig

    return SpecFlowConfig.from_config({**cfg["specflow"], **VARIANTS[method]})


def encoder_spec(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The kit spec (paperflow.core.lm.models) of the CLIP-vision encoder from the config's `encoder` block (its
    keys are CLIPVisionConfig's, listed in the schema so that a typo is refused before transformers loads)."""
    return {"arch": "clip_vision", **{k: v for k, v in cfg.items() if k != "seed_layer"}}


def budget_of(ratio: float, n: int) -> int:
    """K selected tokens at pruning ratio R = 1 - K / N (66.7% -> 21, 77.8% -> 14, 88.9% -> 7 of 64)."""
    return max(1, round(n * (1 - ratio)))


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: known methods, the gated ones present, the claims' ratio among the ratios, the image tiling;
    at paper scale (source.kind llava) the LLaVA and benchmark blocks."""
    if cfg["source"]["kind"] == "llava":
        check_paper(cfg, source)
    else:
        require_choices(cfg["methods"], source=source, key="methods", known=METHODS, required=GATED, noun="method")
    if cfg["report_ratio"] not in cfg["ratios"]:
        raise ConfigError(f"{source}: report_ratio {cfg['report_ratio']} is not one of ratios {cfg['ratios']}")
    image, enc = cfg["data"]["image"], cfg["encoder"]
    side = image["grid"] * image["cell_px"]
    if enc["image_size"] != side or enc["patch_size"] != image["patch"]:
        raise ConfigError(
            f"{source}: encoder.image_size/patch_size ({enc['image_size']}/{enc['patch_size']}) must equal the "
            f"rendered image side {side} and data.image.patch {image['patch']}"
        )
    rd = cfg["reader"]
    if not 1 <= rd.get("fastv_layer", 1) < rd["layers"]:
        raise ConfigError(
            f"{source}: reader.fastv_layer {rd.get('fastv_layer', 1)} must leave at least one of the reader's "
            f"{rd['layers']} blocks after FastV's cut"
        )
    if -enc["seed_layer"] > enc["num_hidden_layers"]:
        raise ConfigError(f"{source}: encoder.seed_layer {enc['seed_layer']} is deeper than num_hidden_layers")


def check_paper(cfg: dict[str, Any], source: str) -> None:
    """source.kind llava: `pretrained` and `benchmarks` present, the paper's comparisons present."""
    from paperflow.specflow.benchmarks import KINDS

    for key in ("pretrained", "benchmarks"):
        if not cfg.get(key):
            raise ConfigError(f"{source}: source.kind llava needs the `{key}` block (see the paper block)")
    require_choices(
        cfg["methods"],
        source=source,
        key="methods",
        known=METHODS,
        required=PAPER_GATED,
        noun="method",
        why="the paper-scale claims compare them",
    )
    for name, bench in cfg["benchmarks"].items():
        if bench["kind"] not in KINDS:
            raise ConfigError(f"{source}: benchmarks.{name}.kind {bench['kind']!r} is not one of {', '.join(KINDS)}")


# The long metrics table the config's claims are judged on (paperflow.specflow.claims.metrics_table and
# paperflow.specflow.paper.metrics_table): synthetic scales "<task>/<column>@<ratio>" per seed; paper scale
# "relative@<ratio>" per benchmark (the item), 100 x score / the unpruned model's score on it.
TASKS = ("count", "control")
COLUMNS = ("relative", "accuracy", "coverage")


def claim_metric(task: str, column: str, ratio: float) -> str:
    return f"{task}/{column}@{ratio:g}"


def paper_claim_metric(ratio: float) -> str:
    return f"relative@{ratio:g}"


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces."""
    if cfg["source"]["kind"] == "llava":
        return [paper_claim_metric(r) for r in cfg["ratios"]]
    return [claim_metric(t, c, r) for t in TASKS for c in COLUMNS for r in cfg["ratios"]]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods this config evaluates."""
    return list(cfg["methods"])
