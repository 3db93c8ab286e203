"""annealed_langevin maths, spec §10.1-10.5: path scores against autograd and quadrature, the Gaussian
moment ODEs, the ULA stationary-variance bias, the tau = 0 reduction and the histogram noise floor (at the
spec's 5000 samples and 200 bins)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.integrate import quad, solve_ivp
from scipy.stats import binom, norm

from paperflow.annealed_langevin.gmm import GMM
from paperflow.annealed_langevin.metrics import noise_floor, panel_metrics, reference
from paperflow.annealed_langevin.paths import PATHS, drift, prox, schedule, step_constants
from paperflow.annealed_langevin.sampler import build_grid, run_em

GMM1 = GMM([[-2.0], [0.0], [2.0]], [[0.2], [0.1], [0.3]], [0.3, 0.4, 0.3])
GMM3 = GMM([[0.0, 1.0, -1.0], [1.5, -0.5, 0.3]], [[0.3, 0.5, 0.2], [0.4, 0.25, 0.6]], [0.35, 0.65])
VARIANTS = {"tempering": "canonical", "dilation": "code", "score": "stable"}  # the drifts under test


def path_drift(path: str, gmm: GMM, prox_iters: int | None = None, **variant: str):
    """`drift` with the variants under test, any of them overridden by `variant`."""
    return drift(path, gmm, **{**VARIANTS, **variant}, prox_iters=prox_iters)


def torch_log_density(gmm: GMM, x: torch.Tensor) -> torch.Tensor:
    """log sum_k w_k N(x; m_k, diag s_k^2), written independently of the library."""
    m, s, w = (torch.tensor(a) for a in (gmm.means, gmm.stds, gmm.weights))
    comp = torch.distributions.Normal(m, s).log_prob(x[:, None, :]).sum(-1)
    return torch.logsumexp(comp + torch.log(w), dim=1)


def autograd(fn, x: np.ndarray) -> np.ndarray:
    xt = torch.tensor(x, requires_grad=True)
    (g,) = torch.autograd.grad(fn(xt).sum(), xt)
    return g.numpy()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.mark.parametrize("gmm", [GMM1, GMM3], ids=["1d", "3d"])
@pytest.mark.parametrize("tau", [0.0, 0.05, 0.5, 0.95])
def test_diffusion_score_is_the_gradient_of_the_convolved_log_density(gmm, tau):
    x = np.random.default_rng(1).normal(scale=2.0, size=(64, gmm.dim))
    ours = path_drift("diffusion", gmm)(x, tau)
    conv = gmm.convolved(tau)
    assert rel_err(ours, autograd(lambda y: torch_log_density(conv, y), x)) < 1e-6


@pytest.mark.parametrize("tau", [0.1, 0.6])
def test_convolved_mixture_is_the_law_of_the_noised_variable(tau):
    """p_tau(y) = int pi((y - sqrt(tau) z) / sqrt(1 - tau)) / sqrt(1 - tau) phi(z) dz, by quadrature."""
    phi = lambda z: np.exp(-0.5 * z**2) / np.sqrt(2 * np.pi)  # noqa: E731
    for y in (-2.3, -0.4, 0.0, 1.7):
        integrand = lambda z, y=y: (
            GMM1.density(np.array([[(y - np.sqrt(tau) * z) / np.sqrt(1 - tau)]]))[0] / np.sqrt(1 - tau) * phi(z)
        )
        exact, _ = quad(
            integrand, -12, 12, limit=400, points=[(y - np.sqrt(1 - tau) * m) / np.sqrt(tau) for m in (-2, 0, 2)]
        )
        assert GMM1.convolved(tau).density(np.array([[y]]))[0] == pytest.approx(exact, rel=1e-7)


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
def test_tempering_drift_is_the_score_of_the_geometric_path(tau):
    x = np.random.default_rng(2).normal(scale=2.0, size=(64, GMM3.dim))
    target = autograd(lambda y: (1 - tau) * torch_log_density(GMM3, y) - tau * 0.5 * (y**2).sum(-1), x)
    assert rel_err(path_drift("tempering", GMM3, tempering="canonical")(x, tau), target) < 1e-6
    official = autograd(
        lambda y: (
            (1 - tau) * np.sqrt(1 - tau) * torch_log_density(GMM3, y / np.sqrt(1 - tau)) - tau * 0.5 * (y**2).sum(-1)
        ),
        x,
    )
    assert rel_err(path_drift("tempering", GMM3, tempering="official")(x, tau), official) < 1e-6


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
def test_dilation_drifts_against_the_score_of_the_dilated_density(tau):
    x = np.random.default_rng(3).normal(scale=2.0, size=(64, GMM3.dim))
    exact = autograd(lambda y: torch_log_density(GMM3, y / np.sqrt(1 - tau)), x)
    assert rel_err(path_drift("dilation", GMM3, dilation="exact")(x, tau), exact) < 1e-6
    assert rel_err(path_drift("dilation", GMM3, dilation="code")(x, tau), (1 - tau) * exact) < 1e-6
    # the claims' control path: the exact drift whatever the dilation variant
    assert rel_err(path_drift("dilation_exact", GMM3, dilation="code")(x, tau), exact) < 1e-6


@pytest.mark.parametrize("tau", [0.002, 0.05, 0.3])
def test_daz_drift_is_minus_the_gradient_of_the_moreau_envelope(tau):
    """M_tau f(x) = min_y f(y) + (x - y)^2 / (2 tau) by brute force on a fine grid, differentiated by
    central differences, against the prox-based drift."""
    ys = np.linspace(-4, 4, 400_001)[:, None]
    f = -GMM1.log_density(ys)
    envelope = lambda x: float(np.min(f + (x - ys[:, 0]) ** 2 / (2 * tau)))  # noqa: E731
    xs = np.array([[-2.6], [-1.0], [-0.3], [0.4], [1.2], [2.5]])
    ours = path_drift("daz", GMM1, prox_iters=300)(xs, tau)[:, 0]
    eps = 1e-3
    fd = np.array([-(envelope(x + eps) - envelope(x - eps)) / (2 * eps) for x in xs[:, 0]])
    assert np.allclose(ours, fd, rtol=2e-3, atol=2e-3), (ours, fd)


def test_prox_at_tau_zero_is_the_identity_and_daz_reduces_to_ula():
    x = np.random.default_rng(4).normal(size=(10, 1))
    assert np.array_equal(prox(GMM1, x, 0.0, 10, GMM1.score), x)


def test_official_score_matches_near_the_modes_and_underflows_far_away():
    near = np.array([[-2.05], [0.02], [1.9]])
    assert np.allclose(GMM1.official_score(near), GMM1.score(near), rtol=1e-4)
    far = np.array([[12.0]])
    assert abs(GMM1.official_score(far)[0, 0]) < 1e-3 < abs(GMM1.score(far)[0, 0])


def gaussian_moment_ode(m: float, s: float, T: float, tau0: float, t_end: float):
    """mu' = -(mu - m_tau) / v_tau, V' = -2 V / v_tau + 2 with m_tau = sqrt(1 - tau) m, v_tau = (1 - tau) s^2 + tau."""

    def rhs(t, y):
        tau = float(schedule(t, T, tau0))
        v = (1 - tau) * s**2 + tau
        return [-(y[0] - np.sqrt(1 - tau) * m) / v, -2 * y[1] / v + 2]

    return solve_ivp(rhs, (0, t_end), [-1.0, 0.0], rtol=1e-11, atol=1e-12).y[:, -1]


def em_moments(m: float, s: float, T: float, tau0: float, t_end: float, h: float) -> tuple[float, float]:
    """Exact mean and variance of the EM chain on the uniform grid (linear drift: closed recursion)."""
    mu, V = -1.0, 0.0
    for t in np.arange(0, t_end - 1e-12, h):
        tau = float(schedule(t, T, tau0))
        v = (1 - tau) * s**2 + tau
        mu, V = mu - h * (mu - np.sqrt(1 - tau) * m) / v, V * (1 - h / v) ** 2 + 2 * h
    return mu, V


def test_gaussian_target_em_particles_follow_the_moment_odes():
    m, s, T, tau0, t_end, h = 1.5, 0.5, 1.0, 0.99, 2.0, 2e-3
    gmm = GMM([[m]], [[s]], [1.0])
    times = np.arange(0, t_end + h / 2, h)
    x = run_em(
        np.full((100_000, 1), -1.0),
        times,
        schedule(times, T, tau0),
        path_drift("diffusion", gmm),
        np.random.default_rng(0),
    )[len(times) - 1][:, 0]
    mu_ode, V_ode = gaussian_moment_ode(m, s, T, tau0, times[-1])
    n = x.size
    assert abs(x.mean() - mu_ode) < 3 * np.sqrt(V_ode / n) + abs(em_moments(m, s, T, tau0, times[-1], h)[0] - mu_ode)
    assert abs(x.var() - V_ode) < 3 * V_ode * np.sqrt(2 / n) + abs(em_moments(m, s, T, tau0, times[-1], h)[1] - V_ode)


def test_em_error_of_the_moments_is_first_order_in_the_step():
    m, s, T, tau0, t_end = 1.5, 0.5, 1.0, 0.99, 2.0
    exact = gaussian_moment_ode(m, s, T, tau0, t_end)
    errs = [np.abs(np.array(em_moments(m, s, T, tau0, t_end, h)) - exact) for h in (8e-3, 4e-3, 2e-3)]
    for coarse, fine in zip(errs, errs[1:]):
        ratio = coarse / fine
        assert np.all((ratio > 1.7) & (ratio < 2.3)), ratio


def test_ula_stationary_variance_has_the_closed_form_bias():
    s, h = 0.5, 0.05
    gmm = GMM([[0.0]], [[s]], [1.0])
    times = np.arange(0, 600 * h, h)
    x = run_em(np.zeros((200_000, 1)), times, np.zeros_like(times), path_drift("ula", gmm), np.random.default_rng(1))[
        len(times) - 1
    ]
    predicted = s**2 / (1 - h / (2 * s**2))
    assert x.var() == pytest.approx(predicted, rel=0.01)
    assert abs(x.var() / s**2 - 1) > 0.05  # the bias (11 % here) is resolved, not hidden in the tolerance


@pytest.mark.parametrize("gmm", [GMM1, GMM3], ids=["1d", "3d"])
def test_tau_zero_makes_every_path_identical_to_ula(gmm):
    times = np.arange(0, 0.2, 1e-3)
    taus = np.zeros_like(times)
    runs = {
        p: run_em(
            np.full((50, gmm.dim), -1.0),
            times,
            taus,
            path_drift(p, gmm, prox_iters=5),
            np.random.default_rng(7),
            snapshots=np.arange(len(times)),
        )
        for p in PATHS
    }
    for p in PATHS:
        for it, x in runs["ula"].items():
            assert np.array_equal(runs[p][it], x), (p, it)


# spec §10.5: 5000 exact samples; §8: 200 equal-width bins over the range of 5000 exact samples
SPEC_FLOOR_N, SPEC_FLOOR_BINS = 5000, 200
COMMITTED_KL_GT = 0.008  # spec §10.5: the official KL_gt column


def expected_floor(gmm: GMM, edges: np.ndarray, mass: np.ndarray, n: int) -> float:
    """Exact expectation of the histogram KL of n exact samples on fixed bins, independent of the sampling code:
    KL = sum_i (c_i / n) log(c_i / (n q_i)) is a sum over bins, and each count c_i is Binomial(n, p_i) with p_i
    the mixture's exact probability of bin i (normal CDFs); q = the reference mass (+ 1e-9, normalised). The
    renormalisation by the in-range count (samples outside the ground-truth range are dropped) is left out."""
    cdf = (gmm.weights[None, :] * norm.cdf(edges[:, None], gmm.means[:, 0], gmm.stds[:, 0])).sum(1)
    q, p = (mass + 1e-9) / (mass + 1e-9).sum(), np.diff(cdf)
    top = min(n, int(n * p.max() + 15 * np.sqrt(n * p.max()) + 20))  # counts above have probability < 1e-40
    c = np.arange(top + 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(c > 0, c / n * np.log(c / (n * q[None, :])), 0.0)
    return float((binom.pmf(c, n, p[None, :]) * terms).sum())


def floors(n: int, bins: int, reps: int) -> tuple[np.ndarray, np.ndarray]:
    """(measured, exact expectation) per repetition: bins from n fresh exact samples, the floor from n others."""
    measured, expected = [], []
    for seed in range(reps):
        ref = reference("density_1d", GMM1, GMM1.sample(n, np.random.default_rng(100 + seed)), [bins], None)
        measured.append(noise_floor(GMM1, ref, n, np.random.default_rng(seed))[0][0])
        expected.append(expected_floor(GMM1, ref.edges[0][0], ref.mass[0], n))
    return np.asarray(measured), np.asarray(expected)


def test_noise_floor_at_the_spec_sample_size_and_binning():
    """Spec §10.5 at the spec's own sample size and binning: 5000 exact samples, 200 equal-width bins over the
    range of 5000 exact samples (§8), KL against the edge-averaged density. The measured floor equals its exact
    binomial expectation (mean over 30 draws, within 3 s.e.). It is about 0.015, twice the spec's 0.008:
    the spec's value does not hold at the spec's size. The committed KL_gt 0.008 is the floor at
    bins / N = 0.02 (10000 samples with 200 bins; the committed plots script has N = 10000 and 100 bins,
    which gives 0.0045, so the column was not made by that script as committed)."""
    measured, expected = floors(SPEC_FLOOR_N, SPEC_FLOOR_BINS, reps=30)
    diff = measured - expected
    assert abs(diff.mean()) < 3 * diff.std(ddof=1) / np.sqrt(len(diff)), (measured.mean(), expected.mean())
    assert expected.mean() / COMMITTED_KL_GT == pytest.approx(1.9, abs=0.2)  # not ≈ 0.008 at the spec's size
    assert floors(10_000, 200, reps=3)[1].mean() == pytest.approx(COMMITTED_KL_GT, abs=0.001)
    assert floors(10_000, 100, reps=3)[1].mean() == pytest.approx(0.0045, abs=0.001)


def test_histogram_kl_is_zero_for_matching_mass_and_large_for_a_wrong_mode_weight():
    gt = GMM1.sample(5000, np.random.default_rng(0))
    ref = reference("density_1d", GMM1, gt, [200], None)
    wrong = GMM([[-2.0], [0.0], [2.0]], [[0.2], [0.1], [0.3]], [0.8, 0.1, 0.1]).sample(5000, np.random.default_rng(1))
    good_kl = panel_metrics(GMM1.sample(5000, np.random.default_rng(1)), ref)[0][0]
    assert panel_metrics(wrong, ref)[0][0] > 10 * good_kl


def test_grids_follow_the_step_rule():
    L_pi, a_pi = GMM1.lipschitz, GMM1.convexity
    ula = build_grid("ula", GMM1, 1.0, 0.99, 1.0, 10**7, "adaptive")
    assert np.allclose(np.diff(ula.t), a_pi / L_pi**2) and a_pi / L_pi**2 == pytest.approx(1.0 / 900)
    for path in ("diffusion", "tempering", "dilation", "daz"):
        grid = build_grid(path, GMM1, 1.0, 0.99, 3.0, 10**7, "adaptive")
        assert grid.t.iloc[-1] >= 3.0 > grid.t.iloc[-2]
        n = len(grid) // 2
        L, a = step_constants(path, grid.tau.iloc[n], L_pi, a_pi, 0.01, 0.09)
        assert grid.t.iloc[n + 1] - grid.t.iloc[n] == pytest.approx(a / L**2)
    assert len(build_grid("dilation", GMM1, 1.0, 0.99, 3.0, 500, "adaptive")) == 500
    assert step_constants("diffusion", 0.0, L_pi, a_pi, 0.01, 0.09) == pytest.approx((L_pi, a_pi))


def test_2d_and_marginal_references_are_probability_masses_that_exact_samples_fit():
    gmm2 = GMM(
        [[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]],
        [[0.2, 0.2], [0.1, 0.2], [0.3, 0.1], [0.1, 0.1]],
        [0.2, 0.4, 0.2, 0.2],
    )
    gt = gmm2.sample(5000, np.random.default_rng(0))
    ref2 = reference("density_2d", gmm2, gt, [200, 202], None)
    assert ref2.mass[0].shape == (200, 202) and ref2.mass[0].sum() == pytest.approx(1.0, abs=0.01)
    exact = panel_metrics(gmm2.sample(5000, np.random.default_rng(1)), ref2)[0][0]
    shifted = panel_metrics(gmm2.sample(5000, np.random.default_rng(1)) + 0.3, ref2)[0][0]
    assert shifted > 3 * exact
    refm = reference("marginals", GMM3, GMM3.sample(5000, np.random.default_rng(0)), [200], n_marginals=3)
    assert len(refm.mass) == 3 and all(m.sum() == 5000 for m in refm.mass)


def test_uniform_grid_gives_every_path_ulas_step_with_the_schedule():
    for path in ("diffusion", "daz"):
        grid = build_grid(path, GMM1, 1.0, 0.99, 1.0, 10**7, grid="uniform")
        assert np.allclose(np.diff(grid.t), 1.0 / 900) and np.allclose(grid.tau, schedule(grid.t, 1.0, 0.99))
    with pytest.raises(ValueError, match="unknown grid 'adaptiv'"):
        build_grid("diffusion", GMM1, 1.0, 0.99, 1.0, 10, grid="adaptiv")


def test_an_em_chain_killed_mid_way_resumes_to_the_uninterrupted_chain(tmp_path):
    """annealed_langevin_train hands each seed's chain a folder under the job's checkpoint_dir(): a chain killed at
    step 30 of 60 (saving every step here; every 30 min in a job) and rerun keeps the uninterrupted chain's
    snapshots bit for bit, the generator restored with the particles (a fresh one would redraw the noise); a
    finished chain rerun takes no step."""
    gmm = GMM([[-1.0], [2.0]], [[0.5], [0.7]], [0.4, 0.6])
    times = np.linspace(0.0, 0.6, 61)
    taus = schedule(times, 1.0, 0.99)
    base = path_drift("diffusion", gmm)
    keep = np.array([0, 20, 40, 60])

    def chain(folder, drift=base, seed=3):
        return run_em(
            np.zeros((500, 1)),
            times,
            taus,
            drift,
            np.random.default_rng(seed),
            keep,
            checkpoint_dir=folder,
            checkpoint_every_s=0.0,
        )

    clean = chain(None)
    calls = []

    def dies_at_step_30(x, tau):
        calls.append(1)
        if len(calls) == 31:
            raise RuntimeError("killed")
        return base(x, tau)

    with pytest.raises(RuntimeError, match="killed"):
        chain(tmp_path / "ckpt", dies_at_step_30)
    resumed = chain(tmp_path / "ckpt")
    reloaded = chain(tmp_path / "ckpt", lambda x, tau: pytest.fail("a finished chain took a step"))
    for snaps in (resumed, reloaded):
        assert sorted(snaps) == [0, 20, 40, 60]
        for it, x in clean.items():
            np.testing.assert_array_equal(snaps[it], x)
    calls.clear()
    with pytest.raises(RuntimeError, match="killed"):
        chain(tmp_path / "other", dies_at_step_30)
    other = chain(tmp_path / "other", seed=4)  # the rerun's generator is the saved one, not the one it was given
    np.testing.assert_array_equal(other[60], clean[60])
