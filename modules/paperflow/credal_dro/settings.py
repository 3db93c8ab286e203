"""Config rules of credal_dro that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError

EXPERIMENTS = ("newsvendor", "regression", "text")


def seeds_of(cfg: dict[str, Any], exp: str) -> list[int]:
    return list(cfg[exp]["seeds"] or cfg["seeds"])


def check(cfg: dict[str, Any], source: str) -> None:
    nv = cfg["newsvendor"]
    if "newsvendor" in cfg["experiments"]:
        for key in ("saa", "saa_trunc", "lv"):
            if key not in nv["methods"]:
                raise ConfigError(
                    f"{source}: newsvendor.methods must include '{key}' (the claims compare LV with truncated and plain SAA)"
                )
        missing = [e for e in nv["claim"]["eps"] if e not in nv["methods"]["lv"]]
        if missing:
            raise ConfigError(
                f"{source}: newsvendor.claim.eps {missing} are not in newsvendor.methods.lv {nv['methods']['lv']}"
            )
        if nv["bulk"]["geometry"] != "box":
            raise ConfigError(
                f"{source}: newsvendor.bulk.geometry must be 'box' (the LP and the in-bulk spikes use the box corners)"
            )
        lo, hi = nv["contamination"]["spike"]
        if lo > hi:
            raise ConfigError(f"{source}: newsvendor.contamination.spike = [{lo}, {hi}] must be increasing")
    if cfg["text"]["encoder"]["device"] == "cuda" and cfg["resources"]["gpus"] == 0:
        raise ConfigError(f"{source}: text.encoder.device = 'cuda' needs resources.gpus >= 1")
