"""ph_vae acceptance at the pipeline level: the claims can fail, and the paper-scale download is real.

The maths (PH closed forms, likelihood routes, sampler, reduction to MLE) is in
test_ph_vae_maths.py; data generators and tail metrics in test_ph_vae_data_metrics.py.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from paperflow.core.config import ConfigError
from paperflow.core.download import ChecksumMismatch
from paperflow.ph_vae.claims import build_claims
from paperflow.ph_vae.prepare import acquire

SEEDS = [0, 1, 2]


def frame(values: dict[str, dict[str, list[float]]], dim: int = 0) -> pd.DataFrame:
    rows = [
        {"decoder": dec, "seed": s, "dim": dim, "metric": metric, "value": v}
        for dec, metrics in values.items()
        for metric, vs in metrics.items()
        for s, v in zip(SEEDS, vs)
    ]
    return pd.DataFrame(rows)


GOOD = {
    "gauss": {"ks_tail@0.95": [0.20, 0.18, 0.22], "q99_rel": [0.30, 0.25, 0.28]},
    "ph": {"ks_tail@0.95": [0.05, 0.07, 0.06], "q99_rel": [0.05, 0.04, 0.06]},
}


PARETO = {"pareto1d": ["gauss", "ph"]}  # the decoders trained on each dataset


def gated(claims):
    return {c.id: c.held for c in claims if c.gated}


def test_claims_hold_when_ph_is_better():
    claims = build_claims({"pareto1d": frame(GOOD)}, "pareto1d", PARETO, SEEDS, 0.95)
    assert gated(claims) == {"ks_tail_ph_lt_gauss_pareto1d": True, "q99_rel_ph_lt_gauss_pareto1d": True}
    ks = next(c for c in claims if c.id.startswith("ks_tail"))
    assert ks.value == pytest.approx(0.06) and ks.threshold == pytest.approx(0.20)


def test_negative_control_gaussian_in_place_of_ph_is_not_held():
    control = {"gauss": GOOD["gauss"], "ph": GOOD["gauss"]}
    claims = build_claims({"pareto1d": frame(control)}, "pareto1d", PARETO, SEEDS, 0.95)
    assert gated(claims) == {"ks_tail_ph_lt_gauss_pareto1d": False, "q99_rel_ph_lt_gauss_pareto1d": False}


def test_a_missing_seed_makes_the_claim_fail_not_pass():
    broken = frame(GOOD)
    broken = broken[~((broken.decoder == "ph") & (broken.seed == 2))]
    assert not any(gated(build_claims({"pareto1d": broken}, "pareto1d", PARETO, SEEDS, 0.95)).values())


def test_other_datasets_are_reported_not_gated():
    joint = frame({"gauss": {"coexc_abs_err@0.95": [0.01] * 3}, "ph": {"coexc_abs_err@0.95": [0.02] * 3}}, dim=-1)
    claims = build_claims(
        {"pareto1d": frame(GOOD), "weibull1d": frame(GOOD), "tcopula2d": joint},
        "pareto1d",
        {name: ["gauss", "ph"] for name in ("pareto1d", "weibull1d", "tcopula2d")},
        SEEDS,
        0.95,
    )
    reported = {c.id: c.held for c in claims if not c.gated}
    assert reported == {
        "ks_tail_ph_lt_gauss_weibull1d": True,
        "q99_rel_ph_lt_gauss_weibull1d": True,
        "coexc_ph_lt_gauss_tcopula2d": False,
    }


DANISH = b'"","X","dat"\n"1",1,1.68374816983895\n"2",2,2.09370424597365\n"3",3,263.250366032211\n'


@pytest.fixture
def server(serve_bytes):
    return serve_bytes(DANISH)


def test_danish_download_verifies_checksum_and_parses(server, tmp_path):
    base, hits = server
    spec = {"kind": "download", "url": f"{base}/Danish.csv", "sha256": hashlib.sha256(DANISH).hexdigest()}
    x, truth = acquire("danish", spec, seed=0, cache_dir=tmp_path)
    np.testing.assert_allclose(x[:, 0], [1.68374816983895, 2.09370424597365, 263.250366032211])
    assert truth["synthetic"] is False and truth["source"]["url"] == spec["url"]
    acquire("danish", spec, seed=0, cache_dir=tmp_path)
    assert len(hits) == 1  # cached by hash
    with pytest.raises(ChecksumMismatch, match="Danish.csv"):
        acquire("danish", spec | {"sha256": "0" * 64}, seed=0, cache_dir=tmp_path / "other")


def test_unpinned_download_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="datasets.danish.sha256 is not set"):
        acquire(
            "danish",
            {"kind": "download", "url": "http://127.0.0.1:9/x.csv", "sha256": None},
            seed=0,
            cache_dir=tmp_path,
        )


@pytest.mark.parametrize("kind, key", [("t_copula", "correlation"), ("download", "rescale")])
def test_a_dataset_kind_names_the_key_it_lacks(kind, key):
    """Kind-specific keys have one default, in config/ph_vae.yaml; a spec without one is refused by name."""
    from paperflow.core.config import load_paper_config
    from paperflow.ph_vae.settings import NEEDS, check

    cfg = load_paper_config("ph_vae", "smoke")
    name = next(n for n, spec in cfg["datasets"].items() if spec["kind"] == kind)
    assert key in NEEDS[kind]
    del cfg["datasets"][name][key]
    with pytest.raises(ConfigError, match=rf"datasets\.{name} \(kind {kind}\) is missing key\(s\) {key}"):
        check(cfg, "config/ph_vae.yaml")
