"""Paper-specific checks of a tiny run's outputs, called by tests/workflow/test_every_paper.py right after that
test's own tiny Snakemake run of the paper (one run per paper in the suite, instead of a second one in the
paper's test module). Each check takes the paper's results folder and asserts what its outputs must hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd


def _gated(out: Path) -> list[dict]:
    return [c for c in json.loads((out / "metrics.json").read_text())["claims"] if c["gated"]]


def lozo_plus(out: Path) -> None:
    claims = json.loads((out / "metrics.json").read_text())["claims"]
    assert {c["id"] for c in claims} >= {
        "rho_refresh_ratio_lozoplus_over_lozo",
        "rho_refresh_lozoplus_gt_lozo_every_seed",
        "control_random_rho_ratio_ge_low",
        "control_random_rho_ratio_le_high",
        "train_loss_lozoplus_lt_lozo",
        "test_accuracy_lozoplus_ge_lozo_minus_1pt",
    }, sorted(c["id"] for c in claims)
    assert not any(c["gated"] for c in claims)  # gated at smoke and cpu only
    rho = next(c for c in claims if c["id"] == "rho_refresh_ratio_lozoplus_over_lozo")
    assert len(rho["values"]) == 2 and rho["control"]["method"] == "lozoplus_random"
    methods = pd.read_csv(out / "tables" / "methods.csv")
    zo_rows = methods[methods["method"] != "ft"]
    assert (zo_rows["forwards"] <= 120).all() and (zo_rows["forwards"] >= 100).all()
    assert (out / "figures" / "loss_vs_forwards.png").read_bytes()[:4] == b"\x89PNG"


def itpo(out: Path) -> None:
    from paperflow.core.io import read_frame

    assert not _gated(out)  # tiny gates nothing; the claims gated at smoke and cpu are reported here
    reported = {c["id"] for c in json.loads((out / "metrics.json").read_text())["claims"]}
    assert {
        "turn_auroc_itponorm",
        "control_permuted_prm_at_chance",
        "success_auc_itponorm_vs_outcome",
        "success_auc_itponorm_gt_prime",
    } <= reported
    turns = read_frame(out / "analysis" / "turns.parquet")[0]
    assert {"score_prm", "score_control", "useful", "useful_after_reply"} <= set(turns.columns)
    assert set(turns["method"]) == {"prime", "itpo", "itponorm"}
    final = read_frame(out / "eval" / "final.parquet")[0]
    assert set(final["method"]) == {"outcome", "prime", "itpo", "itponorm"}


def doubt(out: Path) -> None:
    ids = {c["id"] for c in json.loads((out / "metrics.json").read_text())["claims"]}
    assert {"doubt_beats_se", "stability_n3", "c1_auroc_n3", "c2_doubt_vs_vmf_plain", "c3_consistent_but_wrong"} <= ids
    items = pd.read_parquet(out / "eval" / "items.parquet")
    assert {"wrong", "flag_doubt", "score_doubt", "variety_off_A", "variety_counted_A"} <= set(items.columns)
    table = pd.read_parquet(out / "metrics.parquet")
    paired = table[table["metric"] == "auroc_item/n10"]
    assert len(paired) == len(items) * paired["method"].nunique()  # one AUROC pseudo-value per seed, item, method


def confu(out: Path) -> None:
    claims = {c["id"]: c for c in json.loads((out / "metrics.json").read_text())["claims"]}
    assert set(claims) == {
        "a_lossless_greedy",
        "b_eagle3_vs_vanilla",
        "c_confu_vs_eagle3_extra",
        "c_depth_profile",
        "c_ratio_T1.0",
        "calibration_eagle3_depth",
    }, sorted(claims)
    assert not any(c["gated"] for c in claims.values())  # gated at smoke and cpu only
    controls = {
        k: claims[k]["control"]["method"]
        for k in ("a_lossless_greedy", "b_eagle3_vs_vanilla", "c_confu_vs_eagle3_extra")
    }
    assert controls == {
        "a_lossless_greedy": "confu_leak",
        "b_eagle3_vs_vanilla": "eagle3_features_shuffled",
        "c_confu_vs_eagle3_extra": "confu_f_shuffled",
    }
    frames = {m: pd.read_parquet(out / "eval" / f"{m}.parquet") for m in ("vanilla", "eagle3", "eagle3_extra", "confu")}
    for method, frame in frames.items():
        greedy = frame[(frame.variant == method) & (frame.temperature == 0)]
        assert greedy.lossless.all(), method  # every method is lossless, at every seed
        assert (greedy.cycles >= 1).all() and (greedy.new_after_prefill >= greedy.cycles).all()
    assert set(frames["confu"].variant) == {"confu", "confu_f_shuffled", "confu_leak"}
    assert set(frames["eagle3"].variant) == {"eagle3", "eagle3_features_shuffled"}
    refs = pd.read_parquet(out / "eval" / "references_seed0.parquet")
    assert refs.hf_assisted.notna().sum() >= 1
    assert (out / "figures" / "per_depth.png").read_bytes()[:4] == b"\x89PNG"


CHECKS: dict[str, Callable[[Path], None]] = {"lozo_plus": lozo_plus, "itpo": itpo, "doubt": doubt, "confu": confu}
