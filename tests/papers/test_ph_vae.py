"""ph_vae acceptance at the pipeline level: the claims can fail, and the paper-scale download is real.

The maths (PH closed forms, likelihood routes, sampler, reduction to MLE) is in
test_ph_vae_maths.py; data generators and tail metrics in test_ph_vae_data_metrics.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from paperflow.core.claims import CONTROL_HOLDS, HELD, NO_DATA, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import ChecksumMismatch
from paperflow.ph_vae.claims import metrics_table
from paperflow.ph_vae.prepare import acquire

SEEDS = list(range(6))


def frame(values: dict[str, dict[str, list[float]]], dim: int = 0) -> pd.DataFrame:
    rows = [
        {"decoder": dec, "seed": s, "dim": dim, "metric": metric, "value": v}
        for dec, metrics in values.items()
        for metric, vs in metrics.items()
        for s, v in zip(SEEDS, vs)
    ]
    return pd.DataFrame(rows)


GAUSS = {"ks_tail@0.95": [0.20, 0.18, 0.22, 0.21, 0.19, 0.2], "q99_rel": [0.30, 0.25, 0.28, 0.3, 0.27, 0.26]}
PH = {"ks_tail@0.95": [0.05, 0.07, 0.06, 0.05, 0.06, 0.07], "q99_rel": [0.05, 0.04, 0.06, 0.05, 0.04, 0.06]}


def verdicts(frames, scale="smoke"):
    cfg = load_paper_config("ph_vae", scale)
    table = metrics_table(frames, scale)
    have = set(zip(table.method, table.metric))
    specs = [  # the claims whose numbers the constructed frames hold
        s for s in parse_claims(cfg["claims"], "config/ph_vae.yaml") if all((m, s.metric) in have for m in s.methods())
    ]
    return {v.id: v for v in judge_all(specs, table, scale)}


def gated(found):
    return {k: v.verdict for k, v in found.items() if v.gated}


def test_claims_hold_when_ph_is_better_and_the_heavy_tailed_control_is_not():
    found = verdicts({"pareto1d": frame({"gauss": GAUSS, "ph": PH, "student_t": GAUSS})})
    assert len(found) == 4  # the two gated claims and PH against Student-t (reported)
    assert gated(found) == {"ks_tail_ph_lt_gauss_pareto1d": HELD, "q99_rel_ph_lt_gauss_pareto1d": HELD}
    ks = found["ks_tail_ph_lt_gauss_pareto1d"]
    assert ks.value == pytest.approx(np.mean(PH["ks_tail@0.95"]) - np.mean(GAUSS["ks_tail@0.95"]))
    assert ks.ci_high < 0 and ks.control["verdict"] != HELD and ks.central


def test_student_t_as_good_as_ph_voids_the_claim():
    found = verdicts({"pareto1d": frame({"gauss": GAUSS, "ph": PH, "student_t": PH})})
    assert set(gated(found).values()) == {CONTROL_HOLDS}
    assert not any(v.held for v in found.values() if v.gated)


def test_a_missing_seed_gives_no_data_not_a_verdict():
    broken = frame({"gauss": GAUSS, "ph": PH, "student_t": GAUSS})
    broken = broken[~((broken.decoder == "ph") & (broken.seed == 2))]
    assert set(gated(verdicts({"pareto1d": broken})).values()) == {NO_DATA}


def test_other_datasets_are_reported_not_gated():
    joint = frame({"gauss": {"coexc_abs_err@0.95": [0.01] * 6}, "ph": {"coexc_abs_err@0.95": [0.02] * 6}}, dim=-1)
    found = verdicts(
        {
            "pareto1d": frame({"gauss": GAUSS, "ph": PH, "student_t": GAUSS, "gev": GAUSS}),
            "weibull1d": frame({"gauss": GAUSS, "ph": PH}),
            "tcopula2d": joint,
        }
    )
    reported = {k: v.verdict for k, v in found.items() if not v.gated and k.endswith(("weibull1d", "gauss_tcopula2d"))}
    assert reported == {
        "ks_tail_ph_lt_gauss_weibull1d": HELD,
        "q99_rel_ph_lt_gauss_weibull1d": HELD,
        "coexc_ph_lt_gauss_tcopula2d": "refuted",
    }


def test_a_misspelt_claim_metric_is_refused_when_the_config_loads(tmp_path, monkeypatch):
    import shutil

    for rel in ("config", "workflows/ph_vae"):
        shutil.copytree(f"{Path(__file__).resolve().parents[2]}/{rel}", tmp_path / rel)
    text = (tmp_path / "config/ph_vae.yaml").read_text().replace("pareto1d/q99_rel/dim0", "pareto1d/q99_rl/dim0", 1)
    (tmp_path / "config/ph_vae.yaml").write_text(text)
    with pytest.raises(
        ConfigError, match=r"claims\[1\] \(q99_rel_ph_lt_gauss_pareto1d\)\.metric = 'pareto1d/q99_rl/dim0'"
    ):
        load_paper_config("ph_vae", "smoke", root=tmp_path)


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


def test_a_fit_killed_mid_run_resumes_to_the_uninterrupted_weights_and_history(tmp_path, monkeypatch):
    """ph_vae_train hands each seed's fit a folder under the job's checkpoint_dir(): a fit that dies in epoch 2
    (saves every epoch here; every 30 min in a job) and is rerun ends with the weights and the epoch history of an
    uninterrupted fit, the shuffles' generator restored with the checkpoint (without it the resumed epochs would
    reshuffle from the seed and the weights would differ)."""
    import functools

    import torch

    from paperflow.core import training as core_training
    from paperflow.ph_vae import training
    from paperflow.ph_vae.checkpoint import load_vae

    model = {"latent_dim": 2, "encoder_hidden": [8], "decoder_hidden": [8], "n_phases": 3, "beta": 1.0}
    model["likelihood"] = "expm"
    train = {"epochs": 4, "batch_size": 32, "lr": 1e-2, "weight_decay": 0.0, "grad_clip": 1.0, "devices": 1}
    x = np.random.default_rng(0).pareto(2.2, size=(128, 1)) + 1.0
    monkeypatch.setattr(training, "make_trainer", functools.partial(core_training.make_trainer, checkpoint_every_s=0.0))

    def run(name, resume_dir=None):
        history, _ = training.fit(
            x,
            decoder="ph",
            seed=5,
            model=model,
            train=train,
            run_dir=tmp_path / name,
            checkpoint=tmp_path / f"{name}.ckpt",
            resume_dir=resume_dir,
        )
        return load_vae(tmp_path / f"{name}.ckpt").state_dict(), history

    clean, history = run("clean")
    step = training.VAEModule.training_step

    def dies_in_epoch_2(self, batch, batch_idx):
        if self.current_epoch == 2:
            raise RuntimeError("killed")
        return step(self, batch, batch_idx)

    monkeypatch.setattr(training.VAEModule, "training_step", dies_in_epoch_2)
    with pytest.raises(RuntimeError, match="killed"):
        run("resumed", tmp_path / "ckpt")
    monkeypatch.setattr(training.VAEModule, "training_step", step)
    resumed, history2 = run("resumed", tmp_path / "ckpt")
    assert [k for k in clean if not torch.equal(clean[k], resumed[k])] == []
    pd.testing.assert_frame_equal(history, history2)
