"""dualreform's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.lm.models import model_config

NEEDED_BY = {  # a method and the methods whose results its claims compare it with
    "dualreform": ("sft_human",),
    "retpo": ("sft_human",),
    "single_role": ("sft_human",),
    "raw_ref": ("sft_human",),
    "random_ref": ("sft_human",),
}


PAPER_KEYS = ("data", "pretrained", "lora", "trl_sft", "trl_dpo")
TRAINED = ("retpo", "dualreform", "single_role", "random_ref")  # paper scale: from the pretrained model
PAPER_METHODS = ("raw", "prompted", *TRAINED)
LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
SFT_REQUIRED = (  # TRL SFTConfig values that decide a result (the rest: paperflow.dualreform.lora._args)
    "learning_rate",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "lr_scheduler_type",
    "warmup_steps",
    "max_length",
    "weight_decay",
    "max_grad_norm",
    "bf16",
)
DPO_REQUIRED = (*SFT_REQUIRED, "beta", "loss_type")


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: the world's sizes agree, the model spec is one the kit builds, every preference method
    has the SFT model it starts from; at paper scale, the paper keys and methods (check_paper)."""
    if cfg["source"]["kind"] != "synthetic":
        check_paper(cfg, source)
        return
    if "prompted" in cfg["methods"]:
        raise ConfigError(f"{source}: method 'prompted' needs a pretrained model (source.kind topiocqa)")
    w = cfg["world"]
    if not w["response_values"] <= w["values_per_passage"] <= w["values_per_aspect"]:
        raise ConfigError(f"{source}: world needs response_values <= values_per_passage <= values_per_aspect")
    if w["min_turns"] > w["max_turns"]:
        raise ConfigError(f"{source}: world.min_turns ({w['min_turns']}) > world.max_turns ({w['max_turns']})")
    model_config({**cfg["model"], "vocab_size": 8})  # refuses a misspelt model key by name
    for method, needs in NEEDED_BY.items():
        missing = [n for n in needs if method in cfg["methods"] and n not in cfg["methods"]]
        if missing:
            raise ConfigError(f"{source}: method {method!r} starts from {missing}; add it to methods")


def check_paper(cfg: dict[str, Any], source: str) -> None:
    """Paper scale (source.kind topiocqa): the Hub references and TRL settings given, the methods it runs (no
    sft_human: TopiOCQA has no human rewrites), the model every trained method starts from among them."""
    if cfg["source"]["kind"] != "topiocqa":
        raise ConfigError(
            f"{source}: source.kind {cfg['source']['kind']!r} is not wired at paper scale (QReCC needs its 54M-passage "
            "web corpus, which no pinned Hub dataset holds); allowed: synthetic, topiocqa"
        )
    missing = [k for k in PAPER_KEYS if not cfg.get(k)]
    if missing:
        raise ConfigError(f"{source}: source.kind topiocqa needs {missing} (the paper-scale keys)")
    off = [m for m in cfg["methods"] if m not in PAPER_METHODS]
    if off:
        raise ConfigError(f"{source}: methods {off} do not run at paper scale; allowed: {list(PAPER_METHODS)}")
    if any(m in TRAINED for m in cfg["methods"]) and "prompted" not in cfg["methods"]:
        raise ConfigError(f"{source}: the trained methods start from the pretrained model; add 'prompted' to methods")
    for key, keys in (("trl_sft", SFT_REQUIRED), ("trl_dpo", DPO_REQUIRED)):
        wrong = sorted(set(cfg[key]) ^ set(keys))
        if wrong:
            raise ConfigError(f"{source}: {key} needs exactly {list(keys)}; wrong or missing: {wrong}")


RETRIEVAL_METRICS = ("mrr", "ndcg@3", "recall@10", "recall@100")
RAW_RESPONSE, FIRST_ITERATION = "raw_response", "dualreform_it1"  # the metrics table's reference-accuracy rows


def dataset(cfg: dict[str, Any]) -> str:
    """The metrics-table prefix of this config's data: synthconvqa (smoke, cpu) or topiocqa (paper)."""
    return "synthconvqa" if cfg["source"]["kind"] == "synthetic" else "topiocqa"


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.dualreform.claims.metrics_table): the test retrieval
    metrics per seed (the dense retriever's too where paper scale runs one) and the pseudo-reference accuracy per
    training turn."""
    names = list(RETRIEVAL_METRICS)
    if cfg["source"]["kind"] != "synthetic" and cfg.get("dense"):
        names += [f"dense_{m}" for m in RETRIEVAL_METRICS]
    return [f"{dataset(cfg)}/{m}" for m in (*names, "ref_accuracy")]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The evaluated methods, the raw responses (reference accuracy) and DualReform's first iteration."""
    extra = [RAW_RESPONSE] + ([FIRST_ITERATION] if "dualreform" in cfg["methods"] else [])
    return [*cfg["methods"], *extra]
