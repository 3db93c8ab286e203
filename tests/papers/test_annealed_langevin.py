"""annealed_langevin acceptance at the pipeline level (spec §7, §10.6): the claims can fail, config
errors name the key, the paper-scale downloads refuse unpinned files, and the imaging sampler is
right on a prior with a closed-form posterior. The maths of §10.1-10.5 is in test_annealed_langevin_maths.py."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from paperflow.annealed_langevin.claims import metrics_table
from paperflow.annealed_langevin.evaluation import curves, final_values
from paperflow.annealed_langevin.gmm import GMM
from paperflow.annealed_langevin.imaging import imaging_taus, inpainting_mask, posterior_langevin
from paperflow.annealed_langevin.imaging_data import fetch_pinned
from paperflow.annealed_langevin.paths import drift
from paperflow.annealed_langevin.sampler import build_grid, sample_path
from paperflow.annealed_langevin.settings import PAPER_FINAL_KL, check
from paperflow.core.claims import CONTROL_HOLDS, HELD, INCONCLUSIVE, NO_DATA, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config, read_yaml, repo_root, validate
from paperflow.core.download import UnpinnedDownload

SEEDS = list(range(6))
VARIANTS = {"tempering": "canonical", "dilation": "code", "score": "stable"}  # the drifts under test
GATED = {
    "diffusion_le_0.1_ula",
    "diffusion_le_2_floor",
    "tempering_lt_0.5_ula",
    "diffusion_lt_tempering",
    "tempering_lt_ula",
}


def finals(kl: dict[str, list[float]], floor: float = 0.05) -> dict:
    n = len(SEEDS)
    return {
        ("gmm1d", p, "1"): pd.DataFrame(
            {
                "seed": SEEDS,
                "kl": v,
                "tv": v,
                "floor_kl": [floor] * n,
                "floor_tv": [0.1] * n,
                "iterations": [100] * n,
                "t": [10.0] * n,
            }
        )
        for p, v in kl.items()
    }


# as the paper orders them: dilation (code drift) at 0.63 x ULA, above tempering; the exact dilation stuck like ULA
GOOD = {
    "ula": [1.22, 1.23, 1.21, 1.22, 1.24, 1.2],
    "diffusion": [0.05, 0.06, 0.05, 0.055, 0.05, 0.06],
    "tempering": [0.30, 0.31, 0.29, 0.3, 0.28, 0.31],
    "dilation": [0.78, 0.76, 0.77, 0.75, 0.79, 0.77],
    "dilation_exact": [1.21, 1.24, 1.22, 1.2, 1.23, 1.22],
}


def verdicts(kl, scale="smoke", floor=0.05):
    cfg = load_paper_config("annealed_langevin", scale)
    table = metrics_table(finals(kl, floor), "gmm1d", scale)
    have = set(zip(table.method, table.metric))
    specs = [
        s
        for s in parse_claims(cfg["claims"], "config/annealed_langevin.yaml")
        if all((m, s.metric) in have for m in s.methods())
    ]
    return {v.id: v for v in judge_all(specs, table, scale)}


def gated(found):
    return {k: v.verdict for k, v in found.items() if v.gated}


def test_claims_hold_on_the_expected_ordering():
    found = verdicts(GOOD)
    assert gated(found) == dict.fromkeys(GATED, HELD)
    first = found["diffusion_le_0.1_ula"]
    ratios = np.array(GOOD["diffusion"]) / np.array(GOOD["ula"])
    assert first.effect == "ratio" and first.value == pytest.approx(ratios.mean()) and first.ci_high < 0.1
    assert first.central and first.control["method"] == "tempering" and first.control["verdict"] == REFUTED
    assert found["diffusion_le_2_floor"].value == pytest.approx(np.mean(GOOD["diffusion"]) / 0.05)
    paper = [v for k, v in found.items() if k.startswith("paper_value_")]
    assert paper and not any(v.gated for v in paper)  # only gated at paper scale


def test_ula_in_place_of_diffusion_and_tempering_is_not_held():
    found = gated(verdicts(dict(GOOD, diffusion=GOOD["ula"], tempering=GOOD["ula"])))
    assert HELD not in found.values(), found


def test_a_control_path_that_meets_the_bar_voids_the_claim():
    # dilation at 0.4 x ULA (as our stable-score dilation gets) halves ULA's KL as tempering does and is
    # still above tempering; an exact dilation that escapes ULA's mode weights voids "tempering < ULA"
    found = gated(verdicts(dict(GOOD, dilation=[0.4 * v for v in GOOD["ula"]], dilation_exact=GOOD["dilation"])))
    assert found == dict.fromkeys(GATED, HELD) | {
        "tempering_lt_0.5_ula": CONTROL_HOLDS,
        "tempering_lt_ula": CONTROL_HOLDS,
    }


def test_diffusion_above_twice_the_floor_fails_that_claim_only():
    found = gated(verdicts(GOOD, floor=0.02))
    assert found.pop("diffusion_le_2_floor") == REFUTED and set(found.values()) == {HELD}


def test_one_seed_off_leaves_the_ratio_claim_inconclusive_with_the_seeds_it_needs():
    diffusion = [0.05, 0.06, 0.05, 0.055, 0.05, 0.35]  # one seed at 0.29 x ULA: the mean ratio 0.084 is below 0.1
    found = verdicts(dict(GOOD, diffusion=diffusion))["diffusion_le_0.1_ula"]
    assert found.value < 0.1 and found.verdict == INCONCLUSIVE and found.n_needed > len(SEEDS)


def test_paper_values_are_gated_at_paper_scale_and_judged_by_relative_error():
    kl = {p: [v] * len(SEEDS) for p, v in PAPER_FINAL_KL.items()}
    kl["tempering"] = [0.5] * len(SEEDS)  # 85 % off
    found = verdicts(kl | {"dilation_exact": GOOD["dilation_exact"]}, scale="paper")
    paper = {k: v for k, v in gated(found).items() if k.startswith("paper_value_")}
    assert paper == {
        "paper_value_ula": HELD,
        "paper_value_diffusion": HELD,
        "paper_value_tempering": REFUTED,
        "paper_value_dilation": HELD,
        "paper_value_daz": HELD,
    }
    assert (
        found["paper_value_ula"].control["method"] == "dilation"
        and found["paper_value_ula"].control["verdict"] == REFUTED
    )


def test_a_missing_seed_gives_no_data():
    broken = finals(GOOD)
    key = ("gmm1d", "diffusion", "1")
    broken[key] = broken[key][broken[key].seed != 2]
    cfg = load_paper_config("annealed_langevin", "smoke")
    table = metrics_table(broken, "gmm1d", "smoke")
    specs = [s for s in parse_claims(cfg["claims"], "x") if s.id in GATED]
    found = {v.id: v.verdict for v in judge_all(specs, table, "smoke")}
    assert found["diffusion_le_0.1_ula"] == NO_DATA and found["diffusion_lt_tempering"] == NO_DATA


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


def test_an_imaging_chain_killed_after_a_checkpoint_resumes_and_ends_as_an_uninterrupted_one(tmp_path):
    """With the job's checkpoint folder the chain is saved there (every iteration here: every_s 0); a chain killed at
    iteration 30 and rerun continues from its last save and ends bit-equal to an uninterrupted chain (issue 43)."""
    y = torch.linspace(-1, 1, 3 * 8 * 8, dtype=torch.float64).reshape(1, 3, 8, 8)
    mask = inpainting_mask(tuple(y.shape), 0.5, seed=0)
    taus = imaging_taus("diffusion", 0.5, 60, 5e-3, 0.01)
    args = (y, mask, lambda x, s: x / (1 + s**2), taus, 5e-3, 4.0)
    whole = posterior_langevin(*args, burn_in=10, seed=3, progress=False)
    calls = []

    def dies_at_30(x, s):
        calls.append(1)
        if len(calls) == 31:
            raise RuntimeError("killed")
        return x / (1 + s**2)

    with pytest.raises(RuntimeError, match="killed"):
        posterior_langevin(
            *args[:2], dies_at_30, *args[3:], burn_in=10, seed=3, progress=False, checkpoint_dir=tmp_path, every_s=0
        )
    assert (tmp_path / "loop.pt").exists()
    calls.clear()
    resumed = posterior_langevin(*args, burn_in=10, seed=3, progress=False, checkpoint_dir=tmp_path, every_s=0)
    assert torch.equal(whole[0], resumed[0]) and torch.equal(whole[1], resumed[1])


def test_the_table_reads_runs_by_key_not_by_position():
    """Keyed inputs: the runs in another order (as a reordered config lists them) give the same verdicts."""
    runs = finals(GOOD)
    cfg = load_paper_config("annealed_langevin", "smoke")
    specs = [s for s in parse_claims(cfg["claims"], "x") if s.id in GATED]
    before = judge_all(specs, metrics_table(runs, "gmm1d", "smoke"), "smoke")
    after = judge_all(specs, metrics_table(dict(reversed(list(runs.items()))), "gmm1d", "smoke"), "smoke")
    assert [v.to_json() for v in before] == [v.to_json() for v in after]


def test_a_misspelt_claim_metric_is_refused_when_the_config_loads(repo_copy):
    path = repo_copy / "config" / "annealed_langevin.yaml"
    path.write_text(path.read_text().replace('metric: "gmm1d/T1/kl_over_floor"', 'metric: "gmm1d/T1/kl_over_flor"', 1))
    with pytest.raises(ConfigError, match=r"claims\[1\] \(diffusion_le_2_floor\)\.metric = 'gmm1d/T1/kl_over_flor'"):
        load_paper_config("annealed_langevin", "smoke", repo_copy)
