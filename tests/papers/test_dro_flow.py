"""dro_flow acceptance checks (spec section 10): closed forms of the samplers' laws, the WRM and dual
Sinkhorn-DRO reductions, the cross-check against the `dro` package, the claims' negative control,
config errors, data generators and the torchvision-free ResNet-50."""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from paperflow.core.claims import CONTROL_HOLDS, HELD, NO_DATA, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config, repo_root
from paperflow.dro_flow.claims import limitations, metrics_table
from paperflow.dro_flow.data import circle, two_moons, uls_matrices, uncertain_least_squares
from paperflow.dro_flow.problems import Problem, make_problem, mlp
from paperflow.dro_flow.samplers import (
    SamplerConfig,
    birth_death,
    dual,
    dual_objective,
    dual_weights,
    fisher_rao_reweighting,
    fisher_rao_step,
    loss_and_grad,
    noise,
    penalised,
    rgo,
    svgd,
    wfr,
    wgf,
    wrm,
)
from paperflow.dro_flow.training import PlainSGD, batch_objective, fit, sampler_config

# the tests' own sampler settings; each test sets the values it is about
SAMPLER = {
    "particles": 8,
    "steps": 20,
    "lr": 0.01,
    "weight_lr": 0.08,
    "clamp": None,
    "birth_death": True,
    "grad_scale": 1.0,
    "svgd_init_std": None,
    "rgo_smoothness": None,
    "rgo_trials": 50,
    "dual_max_level": 4,
    "dual_noise": "official",
}


def sampler(**values) -> SamplerConfig:
    return SamplerConfig(**{**SAMPLER, **values})


@pytest.fixture(autouse=True)
def float64_default():
    """This module's closed forms are checked in float64; restore the default for other modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def quadratic(a: float):
    return lambda z: a * (z**2).sum(-1)


def gibbs_moments(a: float, lam: float, eps: float, x: float) -> tuple[float, float]:
    """Mean and variance of exp((a z^2 - lam (z - x)^2) / (lam eps)), lam > a."""
    return lam * x / (lam - a), lam * eps / (2 * (lam - a))


def within_mc(z: torch.Tensor, mean: float, var: float, n_se: float = 3.0) -> None:
    n = z.numel()
    assert abs(float(z.mean()) - mean) < n_se * math.sqrt(var / n), (float(z.mean()), mean)
    assert (
        abs(float(z.var()) - var) < n_se * var * math.sqrt(2 / n) + 0.01 * var
    )  # + the ULA step bias, (float(z.var()), var)


# 1. Langevin stationary law ------------------------------------------------------------------


@pytest.mark.slow
def test_wgf_particles_have_the_closed_form_gibbs_law():
    a, lam, eps, x0 = 0.5, 1.0, 0.5, 1.0
    cfg = sampler(lam=lam, eps=eps, particles=20_000, steps=300, lr=0.02)
    parts = wgf(quadratic(a), torch.full((1, 1, 1), x0), cfg, torch.Generator().manual_seed(0))
    within_mc(parts.z, *gibbs_moments(a, lam, eps, x0))


def test_noise_control_is_the_gibbs_base_law_without_the_loss():
    """The claims' control: WGF's stationary law with the loss switched off (a = 0), N(x, eps/2), equal weights,
    clamped to the domain; the energy is never evaluated."""

    def never(z):
        raise AssertionError("the control arm must not evaluate the loss")

    cfg = sampler(lam=1.0, eps=0.5, particles=20_000)
    parts = noise(never, torch.full((1, 1, 1), 1.0), cfg, torch.Generator().manual_seed(0))
    within_mc(parts.z, *gibbs_moments(0.0, 1.0, 0.5, 1.0))
    assert torch.allclose(parts.w, torch.full((1, 20_000), 1 / 20_000))
    clamped = noise(never, torch.full((1, 1, 1), 1.0), sampler(lam=1.0, eps=0.5, particles=500, clamp=(-1.0, 1.0)))
    assert float(clamped.z.max()) == 1.0 and float(clamped.z.min()) >= -1.0


def test_rgo_is_an_exact_sampler_of_the_gibbs_law():
    a, lam, eps, x0 = 0.3, 1.0, 0.4, -0.5
    cfg = sampler(lam=lam, eps=eps, particles=50_000, steps=200, lr=0.05, rgo_smoothness=2 * a, rgo_trials=200)
    parts = rgo(quadratic(a), torch.full((1, 1, 1), x0), cfg, torch.Generator().manual_seed(1))
    assert parts.info["fallback_rate"] < 1e-3
    within_mc(parts.z, *gibbs_moments(a, lam, eps, x0))


def test_rgo_refuses_a_negative_proposal_variance():
    with pytest.raises(ValueError, match="lam > L/2"):
        rgo(quadratic(0.5), torch.zeros(1, 1, 1), sampler(lam=0.1, eps=0.5, rgo_smoothness=0.5))


# 2. Fisher-Rao weight fixed points and the pure-reweighting reduction to the dual estimator -----


def frozen_particles(seed: int = 0, b: int = 3, m: int = 16, d: int = 2, eps: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((b, 1, d), generator=gen)
    return x, x + math.sqrt(eps / 2) * torch.randn((b, m, d), generator=gen)


def smooth_loss(z: torch.Tensor) -> torch.Tensor:
    return torch.sin(3 * z).sum(-1) + 0.5 * (z**2).sum(-1)


@pytest.mark.parametrize("energy_kind", ["penalised", "loss"])
def test_fisher_rao_weights_converge_to_the_softmax_fixed_point(energy_kind):
    lam, eps, eta_w = 2.0, 0.5, 0.2
    x, z = frozen_particles(eps=eps)
    loss = smooth_loss(z)
    f = penalised(loss, z, x, lam) if energy_kind == "penalised" else loss
    log_w = torch.full(loss.shape, -math.log(loss.shape[1]))
    for _ in range(600):
        log_w = fisher_rao_step(log_w, f, lam, eps, eta_w)
    target = torch.softmax(f / (lam * eps), dim=1)
    assert float((log_w.exp() - target).abs().max()) < 1e-6
    if energy_kind == "loss":
        assert float((log_w.exp() - dual_weights(loss, lam, eps)).abs().max()) < 1e-6
    else:  # the two energies have different fixed points: the check can tell them apart
        assert float((log_w.exp() - dual_weights(loss, lam, eps)).abs().max()) > 1e-3


def test_pure_reweighting_flow_gives_the_dual_estimators_theta_gradient():
    lam, eps = 1.0, 0.3
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((4, 1, 2), generator=gen)
    y = torch.tensor([0, 1, 1, 0])
    problem = Problem(kind="classifier", x=x[:, 0], y=y, model_spec={"hidden": [5]}, n_classes=2)
    model = problem.build(0).double()
    cfg = sampler(lam=lam, eps=eps, particles=32, weight_lr=0.5)
    parts = fisher_rao_reweighting(lambda z: problem.loss(model, z, y), x, cfg, gen, steps=800)
    grads = []
    for objective in ("flow", "dual"):
        model.zero_grad()
        loss = problem.loss(model, parts.z, y)
        value = (parts.w * loss).sum(1).mean() if objective == "flow" else dual_objective(loss, lam, eps)
        value.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-8, rtol=1e-6)


# 3. WRM reduction ---------------------------------------------------------------------------


def classifier_problem(seed: int = 0, n: int = 12):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, 2), generator=gen)
    y = (x.norm(dim=1) > 1).long()
    problem = Problem(kind="classifier", x=x, y=y, model_spec={"hidden": [4]}, n_classes=2)
    return problem, problem.build(seed).double()


def test_wgf_at_zero_entropy_with_one_particle_is_wrm():
    problem, model = classifier_problem()
    cfg = sampler(lam=1.0, eps=0.0, particles=1, steps=15, lr=0.05)
    energy = lambda z: problem.loss(model, z, problem.y)  # noqa: E731
    x = problem.x[:, None, :]
    z_wgf = wgf(energy, x, cfg, torch.Generator().manual_seed(0)).z
    z_wrm = wrm(energy, x, cfg, torch.Generator().manual_seed(1)).z
    assert torch.allclose(z_wgf, z_wrm, atol=1e-14, rtol=0)
    assert not torch.allclose(z_wrm, x)  # the ascent moved the points
    grads = {}
    for method in ("wgf", "wrm"):
        model.zero_grad()
        batch_objective(problem, model, method, problem.x, problem.y, cfg, torch.Generator().manual_seed(2))[
            0
        ].backward()
        grads[method] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.allclose(grads["wgf"], grads["wrm"], atol=1e-14, rtol=0)
    noisy = sampler(lam=1.0, eps=0.1, particles=1, steps=15, lr=0.05)
    assert not torch.allclose(wgf(energy, x, noisy, torch.Generator().manual_seed(0)).z, z_wrm, atol=1e-6)


# 4. Dual objective closed form ----------------------------------------------------------------


@pytest.mark.parametrize("noise,var_factor", [("official", 1.0), ("gibbs", 0.5)])
def test_dual_objective_matches_the_gaussian_closed_form(noise, var_factor):
    lam, eps = 1.0, 0.5
    theta = torch.tensor([0.3, -0.2, 0.1])
    x = torch.tensor([[[1.0, 0.5, -1.0]], [[-0.2, 0.0, 0.4]]])
    gen = torch.Generator().manual_seed(4)
    # the dual sampler's reference noise: variance eps (official) or eps/2 (gibbs) per coordinate
    z1 = dual(
        lambda z: z.sum(-1),
        x[:1].expand(50_000, 1, 3),
        sampler(lam=lam, eps=eps, dual_max_level=0, dual_noise=noise),
        gen,
    ).z
    s2 = float(z1[:, 0, 0].var())
    assert abs(s2 - var_factor * eps) < 0.03 * var_factor * eps
    s2 = var_factor * eps
    z = x + math.sqrt(s2) * torch.randn((2, 1_000_000, 3), generator=gen)
    estimate = float(dual_objective(z @ theta, lam, eps))
    closed = float((x[:, 0] @ theta).mean() + s2 * theta.dot(theta) / (2 * lam * eps))
    assert abs(estimate - closed) < 0.01 * abs(closed)


# 5. SVGD sanity ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_svgd_recovers_the_gaussian_base_without_a_loss():
    eps, lam = 0.5, 1.0
    x = torch.tensor([[[1.0, -2.0]]])
    cfg = sampler(lam=lam, eps=eps, particles=200, steps=1500, lr=0.02, svgd_init_std=0.1)
    z = svgd(lambda z: 0.0 * z.sum(-1), x, cfg, torch.Generator().manual_seed(5)).z[0]
    assert torch.allclose(z.mean(0), x[0, 0], atol=0.1 * math.sqrt(eps / 2))
    assert torch.allclose(z.var(0), torch.full((2,), eps / 2), rtol=0.10)


# WFR birth-death ------------------------------------------------------------------------------


def test_birth_death_moves_dead_particles_and_conserves_mass():
    z = torch.arange(8.0).reshape(2, 4, 1)
    w = torch.tensor([[0.7, 0.29995, 0.00001, 0.00004], [0.25, 0.25, 0.25, 0.25]])
    new_z, new_w, n_dead, _ = birth_death(z, w, 1e-4)
    assert n_dead == 2
    assert new_z[0, :, 0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert torch.allclose(new_w[0], torch.tensor([0.70005 / 3, 0.29995, 0.70005 / 3, 0.70005 / 3]))
    assert torch.equal(new_z[1], z[1]) and torch.equal(new_w[1], w[1])
    assert torch.allclose(new_w.sum(1), torch.ones(2))


def test_birth_death_without_dead_particles_returns_its_inputs():
    """The early return (no particle below the threshold) gives what the general update gives: the same
    locations, weights and gradients, bit for bit."""
    z = torch.arange(8.0, dtype=torch.float64).reshape(2, 4, 1)
    w = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    grad = -z
    new_z, new_w, n_dead, new_grad = birth_death(z, w, 1e-4, grad)
    assert n_dead == 0
    assert torch.equal(new_z, z) and torch.equal(new_w, w) and torch.equal(new_grad, grad)
    dead_one = w.clone()
    dead_one[1] = torch.tensor([0.25, 0.25, 0.49995, 0.00005], dtype=torch.float64)
    _, mixed_w, _, _ = birth_death(z, dead_one, 1e-4, grad)
    assert torch.equal(mixed_w[0], w[0])  # a row without dead particles keeps its weights in the general update too


def test_wfr_weights_sum_to_one_and_favour_high_loss():
    problem, model = classifier_problem(1)
    cfg = sampler(lam=1.0, eps=0.5, particles=6, steps=30, lr=0.05, weight_lr=0.5)
    parts = wfr(
        lambda z: problem.loss(model, z, problem.y), problem.x[:, None, :], cfg, torch.Generator().manual_seed(0)
    )
    assert torch.allclose(parts.w.sum(1), torch.ones(len(problem.x)))
    loss = problem.loss(model, parts.z, problem.y)
    f = penalised(loss, parts.z, problem.x[:, None, :], cfg.lam)
    heavy = parts.w.argmax(1)
    assert float((f.gather(1, heavy[:, None])[:, 0] >= f.median(1).values).float().mean()) > 0.8


# 6. Cross-check of the dual estimator against the `dro` package's Sinkhorn-DRO ----------------


def dro_sinkhorn():
    from paperflow.core.refs import dro_linear_model

    return dro_linear_model().SinkhornLinearDRO


def test_dual_objective_equals_dro_packages_sinkhorn_loss_on_the_same_samples():
    lam, eps, m, b = 2.0, 0.1, 16, 5
    model = dro_sinkhorn()(input_dim=3, model_type="ols", reg_param=eps, lambda_param=lam)
    gen = torch.Generator().manual_seed(6)
    pred = torch.randn((m * b, 1), generator=gen, dtype=torch.float32)  # m-major, as dro lays out its samples
    target = torch.randn((b, 1), generator=gen, dtype=torch.float32).repeat(m, 1)
    reference = float(model._compute_loss(pred, target, m, lam * eps))
    ours = float(dual_objective(((pred - target) ** 2).view(m, b).T.double(), lam, eps))
    assert ours == pytest.approx(reference, rel=1e-5)


def test_dual_objective_agrees_with_dro_packages_robust_objective_on_a_linear_model():
    lam, eps, level = 5.0, 0.2, 9
    rng = np.random.default_rng(7)
    X = rng.normal(size=(256, 3)).astype(np.float32)
    theta, bias = np.array([0.5, -0.3, 0.2], dtype=np.float32), np.float32(0.1)
    y = (X @ theta + 0.3 * rng.normal(size=256)).astype(np.float32)
    model = dro_sinkhorn()(input_dim=3, model_type="ols", reg_param=eps, lambda_param=lam, k_sample_max=level)
    with torch.no_grad():
        model.model.linear.weight.copy_(torch.as_tensor(theta[None]))
        model.model.linear.bias.fill_(float(bias))
    torch.manual_seed(0)
    reference = model._estimate_robust_objective(model._create_dataloader(X, y))
    x = torch.as_tensor(X, dtype=torch.float64)[:, None, :]
    z = x + math.sqrt(eps) * torch.randn((256, 2**level, 3), generator=torch.Generator().manual_seed(8))
    loss = (
        z @ torch.as_tensor(theta, dtype=torch.float64) + float(bias) - torch.as_tensor(y, dtype=torch.float64)[:, None]
    ) ** 2
    assert float(dual_objective(loss, lam, eps)) == pytest.approx(reference, rel=0.02)


# Claims: judged by paperflow.core.claims on the config's claims; the gated ones can fail ---------

SEEDS = [0, 1, 2, 3, 4]
CLAIM = {"dataset": "uls", "large_window": [5.0, 10.0], "small_window": [0.0, 0.8]}
SPECS = {"uls": {"methods": ["erm", "wrm", "wgf", "wfr", "dual", "noise"], "evaluate": {"kind": "shift"}}}


def shift_frame(curves: dict[str, np.ndarray]) -> pd.DataFrame:
    deltas = np.linspace(0, 10, 11)
    return pd.DataFrame(
        [
            {"method": m, "seed": s, "metric": "test_loss", "level": d, "value": v * (1 + 0.02 * s) + 0.01 * s}
            for m, c in curves.items()
            for s in SEEDS
            for d, v in zip(deltas, c)
        ]
    )


ERM = 0.2 + 0.1 * np.linspace(0, 10, 11) ** 2
DRO = 0.4 + 0.05 * np.linspace(0, 10, 11)


def verdicts(frame: pd.DataFrame, scale: str = "smoke") -> dict:
    specs = [
        s for s in parse_claims(load_paper_config("dro_flow", scale)["claims"], "x") if s.metric.startswith("uls/")
    ]
    return {v.id: v for v in judge_all(specs, metrics_table({"uls": frame}, SPECS, CLAIM, scale), scale)}


def gated(found: dict) -> dict:
    return {k: v.verdict for k, v in found.items() if v.gated}


GATED = [
    "uls_wgf_le_0.5x_erm_large_delta",
    "uls_wfr_le_0.5x_erm_large_delta",
    "uls_dual_le_0.5x_erm_large_delta",
    "uls_erm_best_at_delta0",
]


def test_claims_hold_when_dro_is_flat_erm_blows_up_and_noise_does_neither():
    noise = (
        0.5 + 0.06 * np.linspace(0, 10, 11) ** 2
    )  # worse than the DRO methods at Delta = 0, than them at large Delta
    found = verdicts(shift_frame({"erm": ERM, "wrm": DRO, "wgf": DRO, "wfr": DRO, "dual": DRO, "noise": noise}))
    assert gated(found) == dict.fromkeys(GATED, HELD)
    wgf = found["uls_wgf_le_0.5x_erm_large_delta"]
    assert wgf.central and wgf.control["method"] == "noise" and wgf.control["verdict"] != HELD
    assert wgf.ci_high <= 0.5 and wgf.value == pytest.approx(np.mean(wgf.values) / np.mean(wgf.baseline_values), 0.05)
    assert found["uls_erm_best_at_delta0"].baseline_values == pytest.approx(
        [0.4 * (1 + 0.02 * s) + 0.01 * s for s in SEEDS]
    )


def test_noise_as_robust_as_the_samplers_voids_the_large_delta_claims():
    found = verdicts(shift_frame({"erm": ERM, "wrm": DRO, "wgf": DRO, "wfr": DRO, "dual": DRO, "noise": DRO}))
    assert {k: found[k].verdict for k in GATED[:3]} == dict.fromkeys(GATED[:3], CONTROL_HOLDS)
    assert not any(found[k].held for k in GATED[:3])


def test_erm_in_place_of_the_dro_methods_is_refuted():
    found = verdicts(shift_frame({"erm": ERM, "wrm": ERM, "wgf": ERM, "wfr": ERM, "dual": ERM, "noise": ERM}))
    assert {k: found[k].verdict for k in GATED[:3]} == dict.fromkeys(GATED[:3], "refuted")
    assert found["uls_erm_best_at_delta0"].verdict == "refuted"  # a tie at every seed is not "lower"


def test_a_missing_seed_gives_no_data():
    frame = shift_frame({"erm": ERM, "wrm": DRO, "wgf": DRO, "wfr": DRO, "dual": DRO, "noise": ERM})
    found = verdicts(frame[~((frame.method == "wgf") & (frame.seed == 2))])
    assert found["uls_wgf_le_0.5x_erm_large_delta"].verdict == NO_DATA
    assert found["uls_erm_best_at_delta0"].verdict == NO_DATA  # best_other lacks that seed too
    assert found["uls_wfr_le_0.5x_erm_large_delta"].verdict == HELD


def test_attack_metrics_are_named_by_radius_and_every_scale_measures_its_claims():
    frame = pd.DataFrame(
        [
            {"method": m, "seed": 0, "metric": k, "level": r, "value": 0.5}
            for m in ("erm", "wfr")
            for k, r in (("clean_acc", 0.0), ("fgsm_acc", 0.3), ("pgd_acc", 0.3))
        ]
    )
    table = metrics_table({"circle": frame}, {"circle": {"evaluate": {"kind": "attack"}}}, CLAIM, "tiny")
    assert set(table.metric) == {"circle/clean_acc", "circle/fgsm_acc@0.3", "circle/pgd_acc@0.3"}
    for scale in ("tiny", "smoke", "cpu", "paper"):
        cfg = load_paper_config("dro_flow", scale)
        for claim in cfg["claims"]:  # every measured claim's methods run on its dataset (the table has them)
            dataset = claim["metric"].split("/")[0]
            methods = cfg["datasets"][dataset]["methods"] + ["best_other"]
            assert claim["method"] in methods and claim.get("baseline", "erm") in methods, (scale, claim["id"])


def run_specs(scale: str) -> dict:
    cfg = load_paper_config("dro_flow", scale)
    return {n: cfg["datasets"][n] for n in cfg["run_datasets"]}


def test_limitations_follow_the_configured_epochs():
    specs = run_specs("smoke")
    first = limitations("smoke", specs)[0]
    assert f"circle for {specs['circle']['train']['epochs']} epochs (paper: 30)" in first
    assert "uls for 50 epochs (the paper's)," in first  # smoke runs uls and circle only (CI's 120 s rule)
    cpu = run_specs("cpu")
    assert f"moons for {cpu['moons']['train']['epochs']} epochs," in limitations("cpu", cpu)[0]
    specs["circle"]["train"]["epochs"] = 30
    assert "circle for 30 epochs (the paper's)" in limitations("smoke", specs)[0]
    paper = " ".join(limitations("paper", run_specs("paper")))
    assert "Scale" not in paper and "stand in" not in paper


# Config errors ----------------------------------------------------------------------------------


@pytest.fixture
def config_root(tmp_path):
    shutil.copytree(repo_root() / "config", tmp_path / "config")
    return tmp_path


def edit_config(root: Path, edit) -> None:
    path = root / "config" / "dro_flow.yaml"
    cfg = yaml.safe_load(path.read_text())
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg))


def test_a_misspelt_method_names_the_allowed_values(config_root):
    edit_config(config_root, lambda c: c["defaults"]["datasets"]["circle"].update(methods=["erm", "wgff"]))
    with pytest.raises(ConfigError, match=r"methods\[1\] = 'wgff' is not allowed; allowed values: 'erm', 'wrm'"):
        load_paper_config("dro_flow", "smoke", config_root)


def test_rgo_with_lambda_below_half_the_smoothness_is_refused(config_root):
    edit_config(config_root, lambda c: c["defaults"]["datasets"]["circle"]["dro"].update(lam=0.4))
    with pytest.raises(ConfigError, match="method rgo needs lam > rgo_smoothness / 2"):
        load_paper_config("dro_flow", "smoke", config_root)


def test_rgo_without_its_settings_is_refused(config_root):
    edit_config(config_root, lambda c: c["defaults"]["datasets"]["circle"]["dro"].update(rgo_trials=None))
    with pytest.raises(ConfigError, match="method rgo needs rgo_trials"):
        load_paper_config("dro_flow", "smoke", config_root)


def test_a_data_key_of_another_kind_is_refused(config_root):
    edit_config(config_root, lambda c: c["defaults"]["datasets"]["circle"]["data"].update(noise=0.1))
    with pytest.raises(ConfigError, match=r"datasets.circle.data \(kind circle\): unknown key\(s\) 'noise'"):
        load_paper_config("dro_flow", "smoke", config_root)


def test_sampler_config_takes_the_whole_dro_block_and_nothing_else():
    dro = load_paper_config("dro_flow", "smoke")["datasets"]["uls"]["dro"]
    assert sampler_config(dro).clamp == tuple(dro["clamp"])
    with pytest.raises(ConfigError, match="unknown key"):
        sampler_config({**dro, "death_thresold": 1e-3})
    with pytest.raises(ConfigError, match="missing key"):
        sampler_config({k: v for k, v in dro.items() if k != "grad_scale"})


def test_claim_methods_must_be_trained(config_root):
    def drop_wfr(cfg):
        for spec in cfg["defaults"]["datasets"].values():
            spec["methods"] = [m for m in spec["methods"] if m != "wfr"]

    edit_config(config_root, drop_wfr)
    with pytest.raises(ConfigError, match=r"claims\[1\] \(uls_wfr_le_0.5x_erm_large_delta\)\.method = 'wfr'"):
        load_paper_config("dro_flow", "smoke", config_root)


def test_every_scale_resolves():
    for scale in ("tiny", "smoke", "cpu", "paper"):
        cfg = load_paper_config("dro_flow", scale)
        assert cfg["claim"]["dataset"] in cfg["run_datasets"]


# Data -------------------------------------------------------------------------------------------


def test_uls_official_stream_reproduces_the_official_scripts_draws():
    spec = {"dim": 10, "n_train": 20, "n_test": 50, "matrix_seed": 219, "stream": "official"}
    data, meta = uncertain_least_squares(spec, 0)
    np.random.seed(219)
    a0, a1, b = np.random.randn(10, 10), np.random.randn(10, 10), np.random.randn(10)
    xi = np.random.uniform(-0.5, 0.5, 20)
    assert np.array_equal(np.array(meta["A0"]), a0) and np.array_equal(np.array(meta["b"]), b)
    assert np.array_equal(data[data.split == "train"].x0.to_numpy(), xi)
    assert np.array_equal(uls_matrices(10, 219)[1], a1)


def test_circle_training_set_has_no_first_quadrant_and_no_band():
    data, _ = circle({"n_train": 300, "n_test": 600}, 0)
    r = np.hypot(data.x0, data.x1)
    assert not ((r > math.sqrt(2) / 1.3) & (r < 1.3 * math.sqrt(2))).any()
    train, test = data[data.split == "train"], data[data.split == "test"]
    assert len(train) == 300 and not ((train.x0 > 0) & (train.x1 > 0)).any()
    assert ((test.x0 > 0) & (test.x1 > 0)).any()
    assert np.array_equal(data.y, (r > math.sqrt(2)).astype(int))


def test_two_moons_training_set_is_imbalanced():
    data, _ = two_moons({"n_train": 150, "n_test": 400, "noise": 0.15, "imbalance_ratio": 0.5}, 0)
    counts = data[data.split == "train"].y.value_counts()
    assert counts[0] == 100 and counts[1] == 50
    assert data[data.split == "test"].y.value_counts().tolist() == [200, 200]


# CIFAR-10 features without torchvision ----------------------------------------------------------


def test_resnet50_has_torchvisions_parameter_names_and_a_512d_head():
    from paperflow.dro_flow.features import feature_extractor, preprocess_images

    model = feature_extractor(None, head_seed=0).float()
    keys = set(model.state_dict())
    assert {
        "conv1.weight",
        "bn1.running_var",
        "layer1.0.downsample.0.weight",
        "layer4.2.bn3.num_batches_tracked",
    } <= keys
    assert (
        sum(p.numel() for n, p in model.named_parameters() if not n.startswith("fc")) == 23_508_032
    )  # resnet50 without fc
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        feats = model(preprocess_images(images)[:, :, :64, :64].float())
    assert feats.shape == (2, 512) and bool((feats >= 0).all())
    again = feature_extractor(None, head_seed=0).float()
    assert torch.equal(again.fc[0].weight, model.fc[0].weight)  # the random head is seeded


def _cifar_tarball(path: Path) -> Path:
    """A CIFAR-10 python tarball in the real layout: 5 train batches of 2 images, one test batch of 3."""
    import io
    import pickle
    import tarfile

    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for name, n in [*((f"data_batch_{i}", 2) for i in range(1, 6)), ("test_batch", 3), ("batches.meta", 0)]:
            batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(range(n))}
            payload = pickle.dumps(batch)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_cifar_batches_are_unpickled_only_from_a_tarball_whose_sha256_is_pinned_or_recorded(tmp_path):
    """The host publishes torchvision's md5 only; the batches are pickles, so the tarball is read only when the config
    or the paper's lock file (recorded on the first pinned download) holds its sha256 (issue 43, weak pins)."""
    import hashlib

    from paperflow.core.download import WeakPinError, _write_lock_entry, sha256_file
    from paperflow.dro_flow.features import read_cifar10

    tarball = _cifar_tarball(tmp_path / "cifar-10-python.tar.gz")
    md5 = "md5:" + hashlib.md5(tarball.read_bytes()).hexdigest()
    with pytest.raises(WeakPinError, match=r"datasets\.cifar10\.data\.images_sha256"):
        read_cifar10(tarball, sha256=md5, root=tmp_path)
    pinned = read_cifar10(tarball, sha256=sha256_file(tarball), root=tmp_path)
    _write_lock_entry("dro_flow", "https://www.cs.toronto.edu/c.tar.gz", {"sha256": sha256_file(tarball)}, tmp_path)
    recorded = read_cifar10(tarball, sha256=md5, root=tmp_path)
    assert pinned["train"][0].shape == (10, 3, 32, 32) and pinned["test"][1].tolist() == [0, 1, 2]
    for split in ("train", "test"):
        np.testing.assert_array_equal(pinned[split][0], recorded[split][0])


def test_mlp_with_no_hidden_layer_is_logistic_regression():
    assert isinstance(mlp(64, [], 10), torch.nn.Sequential) and len(mlp(64, [], 10)) == 1


# Speed without changing a bit (issue 19) ---------------------------------------------------------


def uls_problem(stream: str = "official") -> Problem:
    spec = {"kind": "uls", "dim": 10, "n_train": 20, "n_test": 50, "matrix_seed": 219, "stream": stream}
    data, meta = uncertain_least_squares(spec, 0)
    return make_problem(data[data.split == "train"].drop(columns="split"), meta, {"kind": "linear_ls"})


def autograd_energy(problem: Problem, model):
    return lambda z: problem.loss(model, z, problem.y)


@pytest.mark.parametrize("scale", [1.0, 10.0, 0.3])
def test_least_squares_closed_form_gradient_is_autograds_bit_for_bit(scale):
    problem = uls_problem()
    model = problem.build(0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        with torch.no_grad():
            model.theta.copy_(3.0 * torch.randn(10, generator=gen))
        z = 2.0 * torch.rand((20, 8, 1), generator=gen) - 1.0
        loss, grad = loss_and_grad(problem.energy(model, problem.y), z, scale)
        ref_loss, ref_grad = loss_and_grad(autograd_energy(problem, model), z, scale)
        assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)
    assert not torch.equal(grad, loss_and_grad(autograd_energy(problem, model), z, 2 * scale)[1])


@pytest.mark.parametrize("method", ["wrm", "dual", "wgf", "wfr", "svg", "rgo"])
def test_uls_training_with_the_closed_form_energy_is_bit_identical_to_autograd(method, monkeypatch):
    problem = uls_problem("independent")
    dro = {**SAMPLER, "lam": 0.1, "eps": 0.5, "steps": 10, "clamp": [-1.0, 1.0], "grad_scale": 10.0}
    dro |= {"rgo_smoothness": 0.1} if method == "rgo" else {}
    train = {"optimizer": "sgd", "lr": 0.01, "epochs": 4, "batch_size": 7, "grad_clip": 100.0, "shuffle": True}
    train |= {"engine": "loop"}
    now, history = fit(problem, method, dro, train, 3)
    monkeypatch.setattr(Problem, "energy", lambda self, model, y: lambda z: self.loss(model, z, y))
    before, history_before = fit(problem, method, dro, train, 3)
    assert torch.equal(now.theta, before.theta)
    assert history.drop(columns="seconds").equals(history_before.drop(columns="seconds"))
    assert not torch.equal(now.theta, problem.build(3).theta)  # it trained


def test_plain_sgd_takes_torch_sgds_steps_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(10, generator=gen)
    params = [torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())]
    opts = [PlainSGD([params[0]], lr=0.01), torch.optim.SGD([params[1]], lr=0.01)]
    for _ in range(5):
        g = torch.randn(10, generator=gen)
        for p, opt in zip(params, opts):
            opt.zero_grad()
            (g * p).sum().backward()
            opt.step()
    assert torch.equal(params[0], params[1]) and not torch.equal(params[0], start)


def test_uls_training_does_not_import_torch_dynamo_or_lightning():
    """torch.optim's first use imports torch._dynamo (about 2 s of CPU); the ULS SGD path must not. Nor may the
    plain loop engine of tiny/smoke/cpu import Lightning (lightning_fabric alone is about 6 s of CPU)."""
    code = (
        "import sys\n"
        "sys.path.insert(0, 'tests/papers')\n"
        "from test_dro_flow import uls_problem\n"
        "from paperflow.dro_flow.training import fit\n"
        "dro = dict(lam=0.1, eps=0.5, particles=2, steps=2, lr=0.01, weight_lr=0.08, clamp=[-1.0, 1.0], birth_death=False,"
        " grad_scale=10.0, svgd_init_std=None, rgo_smoothness=None, rgo_trials=None, dual_max_level=4, dual_noise='official')\n"
        "fit(uls_problem(), 'wgf', dro, dict(optimizer='sgd', lr=0.01, epochs=1, batch_size=20, grad_clip=100.0, shuffle=False,"
        " engine='loop'), 0)\n"
        "print('torch._dynamo' in sys.modules)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'lightning_fabric', 'pytorch_lightning')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root(), check=True)
    assert out.stdout.strip().splitlines()[-2:] == ["False", "[]"]


# Training engines (issue 54) --------------------------------------------------------------------

ENGINE_CASES = {  # least squares (float64, PlainSGD, closed-form energy) and a classifier (float32 MLP, Adam, autograd)
    "uls": (
        lambda: uls_problem("independent"),
        {"lam": 0.1, "eps": 0.5, "steps": 5, "clamp": [-1.0, 1.0], "grad_scale": 10.0, "rgo_smoothness": 0.1},
        {"optimizer": "sgd", "lr": 0.01, "epochs": 3, "batch_size": 7, "grad_clip": 0.5, "shuffle": True},
    ),
    "classifier": (
        lambda: classifier_problem(n=24)[0],
        {"lam": 1.0, "eps": 0.15, "steps": 3, "rgo_smoothness": 1.0},
        {"optimizer": "adam", "lr": 0.05, "epochs": 3, "batch_size": 5, "grad_clip": 0.5, "shuffle": True},
    ),
}


def engine_fit(case: str, method: str, engine: str, seed: int = 3, run_dir=None, checkpoint_dir=None, **train):
    from paperflow.dro_flow import training

    make, dro, base = ENGINE_CASES[case]
    model, history = training.fit(
        make(),
        method,
        {**SAMPLER, **dro},
        {**base, **train, "engine": engine},
        seed,
        run_dir,
        checkpoint_dir=checkpoint_dir,
    )
    return model.state_dict(), history.drop(columns="seconds").sort_index(axis=1)


def same_fit(a, b) -> bool:
    return a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0]) and a[1].equals(b[1])


@pytest.mark.parametrize(
    ("case", "method"), [("uls", "wfr"), ("uls", "rgo"), ("classifier", "svg"), ("classifier", "dual")]
)
def test_loop_and_lightning_engines_train_the_same_models(case, method, tmp_path):
    """The paper-scale Fabric engine and the plain loop give the same weights and history bit for bit on the CPU
    (same steps, clipping, optimiser and random streams), and the Fabric run logs one CSV row per epoch. The
    controls show that the comparison can fail: another seed or no effective clipping changes the weights."""
    loop = engine_fit(case, method, "loop")
    fabric = engine_fit(case, method, "lightning", run_dir=tmp_path)
    assert same_fit(loop, fabric)
    assert not same_fit(loop, engine_fit(case, method, "loop", seed=4))
    assert not same_fit(loop, engine_fit(case, method, "loop", grad_clip=1.0e6))
    logged = pd.read_csv(tmp_path / "csv" / "seed3" / "metrics.csv")
    assert logged["epoch"].tolist() == [0, 1, 2]
    assert logged["train/loss"].tolist() == fabric[1]["loss"].tolist()


@pytest.mark.parametrize(("case", "method", "engine"), [("uls", "wfr", "loop"), ("classifier", "svg", "lightning")])
def test_a_fit_killed_mid_run_resumes_to_the_uninterrupted_fit(case, method, engine, tmp_path, monkeypatch):
    """dro_flow_train hands each seed's fit a folder under the job's checkpoint_dir(): a fit that dies in epoch 2
    (saving every epoch here; every 30 min in a job) and is rerun ends with the uninterrupted fit's weights and
    history, the generator of the shuffles and samplers restored (a fresh one would redraw epoch 0's order); a
    finished fit rerun takes no step. Both engines (plain SGD least squares; Adam classifier under Fabric)."""
    from paperflow.dro_flow import training

    def run(folder, **train):
        return engine_fit(case, method, engine, run_dir=tmp_path / "run", checkpoint_dir=folder, **train)

    make, dro, base = ENGINE_CASES[case]
    monkeypatch.setattr(training, "fit", functools.partial(training.fit, checkpoint_every_s=0.0))
    clean = engine_fit(case, method, engine, run_dir=tmp_path / "clean")
    objective, steps = training.batch_objective, []

    def dies_in_epoch_2(problem, *args):
        steps.append(1)
        if len(steps) > 2 * -(-len(problem.x) // base["batch_size"]):
            raise RuntimeError("killed")
        return objective(problem, *args)

    monkeypatch.setattr(training, "batch_objective", dies_in_epoch_2)
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "ckpt")
    monkeypatch.setattr(training, "batch_objective", objective)
    assert same_fit(run(tmp_path / "ckpt"), clean)
    monkeypatch.setattr(training, "batch_objective", lambda *a: pytest.fail("a finished fit took a step"))
    assert same_fit(run(tmp_path / "ckpt"), clean)
    monkeypatch.setattr(training.GeneratorState, "load_state_dict", lambda self, state: None)
    monkeypatch.setattr(training, "batch_objective", objective)
    (tmp_path / "ckpt2").mkdir()
    with pytest.raises(RuntimeError, match="killed"):
        steps.clear()
        monkeypatch.setattr(training, "batch_objective", dies_in_epoch_2)
        run(tmp_path / "ckpt2")
    monkeypatch.setattr(training, "batch_objective", objective)
    assert not same_fit(run(tmp_path / "ckpt2"), clean)  # the comparison can fail: no generator restored


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (tools/gpu_check.sh on a GPU machine)")
@pytest.mark.parametrize(
    ("case", "method"),
    [("uls", "wfr"), ("uls", "rgo"), ("classifier", "wgf"), ("classifier", "svg"), ("classifier", "dual")],
)
def test_fabric_engine_on_cuda_matches_the_cpu_loop(case, method):
    """Fabric's `auto` device is the GPU: every sampler's tensors live there (their draws come from the CPU generator,
    so both devices see the same noise) and the weights match the CPU loop's up to floating-point reordering (float64
    least squares: 1e-8; float32 classifier after 3 Adam epochs: 1e-4)."""
    from paperflow.core.training import make_fabric

    assert make_fabric().device.type == "cuda"
    loop, fabric = engine_fit(case, method, "loop"), engine_fit(case, method, "lightning")
    tol = 1e-8 if case == "uls" else 1e-4
    for key, value in loop[0].items():
        assert fabric[0][key].device.type == "cpu"
        torch.testing.assert_close(fabric[0][key], value, rtol=tol, atol=tol)


def test_an_unknown_engine_names_the_key_and_the_allowed_values(config_root):
    edit_config(config_root, lambda c: c["defaults"]["datasets"]["circle"]["train"].update(engine="trainer"))
    with pytest.raises(
        ConfigError, match=r"train\.engine = 'trainer' is not allowed; allowed values: 'loop', 'lightning'"
    ) as err:
        load_paper_config("dro_flow", "smoke", config_root)
    assert len(str(err.value).strip().splitlines()[1:]) == 1  # under the "invalid configuration:" header, one line


def test_paper_scale_trains_under_fabric_and_the_smaller_scales_with_the_loop():
    for scale in ("tiny", "smoke", "cpu", "paper"):
        engines = {spec["train"]["engine"] for spec in run_specs(scale).values()}
        assert engines == ({"lightning"} if scale == "paper" else {"loop"}), scale


def test_an_unpinned_cifar_source_is_refused_naming_its_full_config_key(tmp_path, monkeypatch):
    from paperflow.core.config import ConfigError
    from paperflow.core.download import PIN_ENV
    from paperflow.dro_flow.cifar import fetch_sources

    monkeypatch.delenv(PIN_ENV, raising=False)
    spec = dict(load_paper_config("dro_flow", "paper")["datasets"]["cifar10"]["data"], images_sha256=None)
    with pytest.raises(ConfigError, match=r"datasets\.cifar10\.data\.images_sha256 is not set.*paperflow pin dro_flow"):
        fetch_sources(spec, tmp_path / "i.tar.gz", tmp_path / "w.pth", "datasets.cifar10.data")
