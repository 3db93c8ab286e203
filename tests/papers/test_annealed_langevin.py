"""annealed_langevin acceptance at the pipeline level (spec §7, §10.6): the claims can fail, config
errors name the key, the paper-scale downloads refuse unpinned files, and the imaging sampler is
right on a prior with a closed-form posterior. The maths of §10.1-10.5 is in test_annealed_langevin_maths.py."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from paperflow.annealed_langevin.claims import PAPER_FINAL_KL, build_claims
from paperflow.annealed_langevin.evaluation import curves, final_values
from paperflow.annealed_langevin.gmm import GMM
from paperflow.annealed_langevin.imaging import imaging_taus, inpainting_mask, posterior_langevin
from paperflow.annealed_langevin.imaging_data import fetch_pinned
from paperflow.annealed_langevin.paths import drift
from paperflow.annealed_langevin.sampler import build_grid, sample_path
from paperflow.annealed_langevin.settings import check
from paperflow.core.config import ConfigError, load_paper_config, read_yaml, repo_root, validate
from paperflow.core.download import UnpinnedDownload

SEEDS = [0, 1, 2]
VARIANTS = {"tempering": "canonical", "dilation": "code", "score": "stable"}  # the drifts under test
RUNS = {
    "gmm1d": {
        "paths": ["ula", "diffusion", "tempering", "dilation"],
        "horizons": ["1"],
        "n_particles": 1500,
        "t_max": 10,
        "metric": "density_1d",
    }
}


def finals(kl: dict[str, list[float]], floor: float = 0.05) -> dict:
    return {
        ("gmm1d", p, "1"): pd.DataFrame(
            {
                "seed": SEEDS,
                "kl": v,
                "tv": v,
                "floor_kl": [floor] * 3,
                "floor_tv": [0.1] * 3,
                "iterations": [100] * 3,
                "t": [10.0] * 3,
            }
        )
        for p, v in kl.items()
    }


GOOD = {
    "ula": [1.22, 1.23, 1.21],
    "diffusion": [0.05, 0.06, 0.05],
    "tempering": [0.30, 0.31, 0.29],
    "dilation": [0.48, 0.47, 0.5],
}


def gated(claims):
    return {c.id: c.held for c in claims if c.gated}


def test_claims_hold_on_the_expected_ordering():
    claims = build_claims(finals(GOOD), claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="smoke")
    assert all(gated(claims).values()) and len(gated(claims)) == 5
    first = next(c for c in claims if c.id == "diffusion_le_0.1_ula")
    assert first.value == pytest.approx(np.mean(GOOD["diffusion"])) and first.threshold == pytest.approx(
        0.1 * np.mean(GOOD["ula"])
    )
    paper = [c for c in claims if c.id.startswith("paper_value_")]
    assert paper and not any(c.gated for c in paper)  # only gated at paper scale


def test_negative_control_ula_in_place_of_diffusion_and_tempering_is_not_held():
    control = dict(GOOD, diffusion=GOOD["ula"], tempering=GOOD["ula"])
    held = gated(
        build_claims(finals(control), claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="smoke")
    )
    assert not any(held.values()), held


def test_diffusion_above_twice_the_floor_fails_that_claim_only():
    held = gated(
        build_claims(finals(GOOD, floor=0.02), claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="smoke")
    )
    assert held.pop("diffusion_le_2_floor") is False and all(held.values())


def test_paper_values_are_gated_at_paper_scale_and_judged_by_relative_error():
    kl = {p: [v] * 3 for p, v in PAPER_FINAL_KL.items() if p in RUNS["gmm1d"]["paths"]}
    kl["tempering"] = [0.5] * 3  # 85 % off
    claims = build_claims(finals(kl), claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="paper")
    held = gated(claims)
    assert held["paper_value_ula"] and held["paper_value_diffusion"] and not held["paper_value_tempering"]


def test_a_missing_path_makes_the_claims_fail_not_pass():
    broken = {k: v for k, v in GOOD.items() if k != "diffusion"}
    held = gated(build_claims(finals(broken), claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="smoke"))
    assert not held["diffusion_le_0.1_ula"] and not held["diffusion_lt_tempering"]


def test_sampler_and_evaluation_end_to_end_separate_diffusion_from_ula():
    """A short real run (N = 400, t_max = 4): ULA keeps the wrong mode weights from x0 = -1, the
    diffusion path does not; both curves start at iteration 0 and end at t >= t_max."""
    gmm = GMM([[-2.0], [0.0], [2.0]], [[0.2], [0.1], [0.3]], [0.3, 0.4, 0.3])
    gt = gmm.sample(5000, np.random.default_rng(0))
    spec = {"metric": "density_1d", "bins": [200], "marginals": None}
    out = {}
    for path in ("ula", "diffusion"):
        grid = build_grid(path, gmm, 1.0, 0.99, 4.0, 10**7, "adaptive")
        snaps = sample_path(
            gmm,
            grid,
            drift(path, gmm, **VARIANTS, prox_iters=None),
            x0=-1.0,
            n_particles=400,
            seeds=[0],
            check_every=500,
            progress=False,
        )
        curve = curves(snaps, gmm, gt, spec)
        assert curve.it.min() == 0 and curve.t.max() >= 4.0 - 2e-3  # ULA: arange(0, t_max, h), as the official grid
        out[path] = final_values(curve).kl.iloc[0]
    assert out["diffusion"] < 0.5 * out["ula"], out


def bad(cfg_change, scale="smoke"):
    cfg = copy.deepcopy(load_paper_config("annealed_langevin", scale))
    cfg_change(cfg)
    return cfg


def test_config_typo_in_a_path_name_names_the_key_and_the_allowed_values():
    schema = read_yaml(repo_root() / "config" / "schemas" / "annealed_langevin.schema.yaml")
    cfg = bad(lambda c: c["targets"]["gmm1d"].update(paths=["ula", "difusion"]))
    with pytest.raises(
        ConfigError, match=r"targets\.gmm1d\.paths\[1\] = 'difusion' is not allowed; allowed values: 'ula'"
    ):
        validate(cfg, schema, "config/annealed_langevin.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["claim"].update(target="gmm2d"), "claim.target"),
        (lambda c: c["claim"].update(T=5), "claim.T"),
        (lambda c: c["targets"]["gmm1d"].update(paths=["ula", "diffusion"]), "the claim needs it"),
        (lambda c: c["targets"]["gmm1d"].update(metric="density_2d", bins=[10, 10]), "needs dimension 2"),
        (lambda c: c["targets"]["gmm1d"].update(weights=[0.5, 0.4, 0.3]), "sum to"),
        (lambda c: c["targets"]["gmm10d"].update(means=[[0.0]] * 4, stds=[[1.0]] * 4), "not both"),
    ],
)
def test_cross_field_config_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        check(bad(change), "config/annealed_langevin.yaml")


def test_paper_scale_downloads_are_pinned_and_an_unpinned_one_is_refused(tmp_path, monkeypatch):
    from paperflow.core.download import PIN_ENV

    cfg = load_paper_config("annealed_langevin", "paper")
    for name in ("weights", "image"):  # the Hub's LFS sha256 at a commit URL, not the moving main
        assert len(cfg["imaging"][name]["sha256"]) == 64 and "/resolve/main/" not in cfg["imaging"][name]["url"]
    monkeypatch.delenv(PIN_ENV, raising=False)
    unpinned = dict(cfg["imaging"]["weights"], sha256=None)
    with pytest.raises(
        UnpinnedDownload, match=r"imaging\.weights\.sha256 is not set.*`paperflow pin annealed_langevin`"
    ):
        fetch_pinned("weights", unpinned, tmp_path / "diffusion_ffhq_10m.pt")
    assert not (tmp_path / "diffusion_ffhq_10m.pt").exists()


def test_only_the_imaging_rule_needs_a_gpu_and_only_at_paper_scale():
    assert load_paper_config("annealed_langevin", "smoke")["imaging"]["enabled"] is False
    paper = load_paper_config("annealed_langevin", "paper")
    assert paper["imaging"]["enabled"] and paper["resources"]["gpus"] >= 1


def test_imaging_sampler_recovers_the_closed_form_gaussian_posterior():
    """Prior N(0, I): its VE denoiser D(x, sigma) = x / (1 + sigma^2) makes the prior drift -x for any
    tau. Observed pixels: posterior N(lam y / (1 + lam), 1 / (1 + lam)); unobserved: N(0, 1)."""
    lam, step = 4.0, 5e-3
    y = torch.linspace(-1, 1, 3 * 16 * 16, dtype=torch.float64).reshape(1, 3, 16, 16)
    mask = inpainting_mask(tuple(y.shape), 0.5, seed=0)
    taus = imaging_taus("diffusion", 0.5, 6000, step, 0.01)
    mean, _ = posterior_langevin(
        y, mask, lambda x, s: x / (1 + s**2), taus, step, lam, burn_in=1000, seed=0, progress=False
    )
    obs = mask.expand_as(y).bool()
    slope = lambda sel: float((mean[sel] * y[sel]).sum() / (y[sel] ** 2).sum())  # noqa: E731
    assert slope(obs) == pytest.approx(lam / (1 + lam), abs=0.05)
    assert abs(slope(~obs)) < 0.1
    assert torch.allclose(imaging_taus("ula", None, 5, step, 0.01), torch.full((5,), 0.01, dtype=torch.float64))


def test_claims_read_runs_by_key_not_by_position():
    """Keyed inputs: the runs in another order (as a reordered config lists them) give the same claims."""
    runs = finals(GOOD)
    before = build_claims(runs, claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="smoke")
    after = build_claims(
        dict(reversed(list(runs.items()))), claim_target="gmm1d", claim_T="1", seeds=SEEDS, runs=RUNS, scale="smoke"
    )
    assert [c.to_json() for c in before] == [c.to_json() for c in after]
