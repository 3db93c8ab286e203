"""st_gfn acceptance checks of spec section 10 on the maths: Parseval/DB and TB limits against torchgfn's
own losses on the same batch, the regularised-value-iteration matrix form, Wiener-Khinchin, and the
enumerable 2x2 toy DAG whose exact L_ST optimum samples R / Z for any lam."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from paperflow.st_gfn import intrinsic, spectral
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.identities import identity_gaps

GRID = {"kind": "hypergrid", "ndim": 2, "height": 8, "R0": 0.1, "R1": 0.5, "R2": 2.0, "sigma": 1.0}


def random_batch(seed: int, t_max: int = 15, batch: int = 32):
    g = torch.Generator().manual_seed(seed)
    delta = torch.randn(t_max, batch, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t_max + 1, (batch,), generator=g)
    return delta, lengths


def masked(delta: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    return [delta[: int(n), b] for b, n in enumerate(lengths)]


# --- 10.1 Parseval / DB ---------------------------------------------------------------------------


def test_lam0_is_the_sum_of_squared_residuals_per_trajectory():
    delta, lengths = random_batch(0)
    got = spectral.spectral_loss_per_trajectory(delta, lengths, spectral.tikhonov(0.0))
    want = torch.stack([(d**2).sum() for d in masked(delta, lengths)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_padding_beyond_a_trajectory_never_leaks_into_its_loss():
    delta, lengths = random_batch(1)
    noisy = delta.clone()
    steps = torch.arange(delta.shape[0])[:, None]
    noisy[steps >= lengths[None, :]] = 1e3
    for weight in (spectral.tikhonov(2.0), spectral.dc_only(), spectral.butterworth(0.2)):
        torch.testing.assert_close(
            spectral.spectral_loss_per_trajectory(noisy, lengths, weight),
            spectral.spectral_loss_per_trajectory(delta, lengths, weight),
        )


@pytest.mark.parametrize("time_features", [0, 4])
def test_lam0_equals_torchgfn_db_and_dc_equals_torchgfn_tb_on_the_same_batch(time_features):
    env = make_env(GRID)
    for seed in range(3):
        gaps = identity_gaps(env, hidden=32, layers=2, batch=16, seed=seed, time_features=time_features)
        assert gaps["lam0_db_gap"] < 1e-5 * max(1.0, gaps["db_sum"])
        assert gaps["dc_tb_gap"] < 1e-4
        assert gaps["db_sum"] > 1e-3 and gaps["tb_loss"] > 1e-3  # not a trivially zero batch
        assert gaps["filtered_db_gap"] > 1e-3 and gaps["filtered_tb_gap"] > 1e-3  # the control's filtered gaps


# --- 10.2 TB limit ---------------------------------------------------------------------------------


def test_dc_only_times_n_is_the_squared_sum_of_residuals():
    delta, lengths = random_batch(2)
    got = lengths.double() * spectral.spectral_loss_per_trajectory(delta, lengths, spectral.dc_only())
    want = torch.stack([d.sum() ** 2 for d in masked(delta, lengths)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_huge_lam_tikhonov_agrees_with_dc_only():
    delta, lengths = random_batch(3)
    lengths = lengths.clamp_min(2)
    big = spectral.spectral_loss_per_trajectory(delta, lengths, spectral.tikhonov(1e10))
    dc = spectral.spectral_loss_per_trajectory(delta, lengths, spectral.dc_only())
    torch.testing.assert_close(big, dc, rtol=1e-3, atol=1e-12)


def test_intermediate_lam_lies_between_the_limits_and_decreases():
    delta, lengths = random_batch(4)
    values = [
        spectral.spectral_loss_per_trajectory(delta, lengths, spectral.tikhonov(lam)).sum()
        for lam in (0.0, 0.5, 2.0, 8.0, 1e10)
    ]
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:]))
    assert values[0] > values[2] > values[-1]


# --- 10.3 regularised value iteration ------------------------------------------------------------


@pytest.mark.parametrize("n,lam", [(1, 2.0), (5, 0.5), (8, 2.0), (15, 8.0)])
def test_tikhonov_loss_is_the_quadratic_form_of_the_smoother(n, lam):
    g = torch.Generator().manual_seed(n)
    delta = torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
    fft_loss = spectral.spectral_energy(delta[None, :], spectral.tikhonov(lam))[0]
    op = spectral.tikhonov_operator(n, lam)
    matrix_loss = delta @ op @ delta
    assert float(fft_loss) == pytest.approx(float(matrix_loss), rel=1e-10, abs=1e-12)
    (g_fft,) = torch.autograd.grad(fft_loss, delta)
    (g_mat,) = torch.autograd.grad(matrix_loss, delta)
    torch.testing.assert_close(g_fft, g_mat, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(spectral.circulant_operator(n, spectral.tikhonov(lam)), op, rtol=1e-9, atol=1e-10)


def test_circular_difference_spectrum_and_the_averaging_limit():
    n = 9
    d = spectral.circular_difference(n)
    eig = torch.linalg.eigvalsh(d.T @ d)
    want = torch.sort(4 * torch.sin(math.pi * spectral.frequencies(n)) ** 2).values
    torch.testing.assert_close(eig, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        spectral.tikhonov_operator(n, 1e9), torch.full((n, n), 1.0 / n, dtype=torch.float64), rtol=0, atol=1e-6
    )


def test_pad_to_max_uses_one_fft_of_the_padded_length():
    delta, lengths = random_batch(5)
    got = spectral.spectral_loss_per_trajectory(delta, lengths, spectral.tikhonov(2.0), pad_to_max=True)
    op = spectral.tikhonov_operator(delta.shape[0], 2.0)
    steps = torch.arange(delta.shape[0])[:, None]
    padded = torch.where(steps < lengths[None, :], delta, torch.zeros_like(delta))
    want = torch.einsum("tb,ts,sb->b", padded, op, padded)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # at lam = 0 padding changes nothing (Parseval), at lam > 0 it does
    zero = spectral.spectral_loss_per_trajectory(delta, lengths, spectral.tikhonov(0.0), pad_to_max=True)
    torch.testing.assert_close(zero, (padded**2).sum(0))
    assert not torch.allclose(got, spectral.spectral_loss_per_trajectory(delta, lengths, spectral.tikhonov(2.0)))


def test_length_weighting_multiplies_each_trajectory_by_its_length():
    per, lengths = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 2, 4])
    assert float(spectral.reduce_trajectories(per, lengths, False)) == pytest.approx(2.0)
    assert float(spectral.reduce_trajectories(per, lengths, True)) == pytest.approx((1 + 4 + 12) / 3)


def test_filters_reject_bad_parameters():
    with pytest.raises(ValueError, match="lam"):
        spectral.tikhonov(-1.0)
    with pytest.raises(ValueError, match="omega_c"):
        spectral.butterworth(0.7)
    with pytest.raises(ValueError, match="unknown filter"):
        spectral.make_filter("gaussian")


# --- 10.4 Wiener-Khinchin ---------------------------------------------------------------------------


def test_autocorrelation_by_fft_equals_the_direct_circular_sum():
    rng = np.random.default_rng(0)
    for n in (1, 7, 16, 33):
        x = rng.normal(size=n)
        direct = np.array([np.sum(x * np.roll(x, -lag)) for lag in range(n)])
        got = intrinsic.circular_autocorrelation_fft(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, direct, rtol=1e-10, atol=1e-10)


def test_the_kernel_spectrum_reproduces_the_lorentzian_psd():
    n, omega_r = 15, 0.1
    psd = intrinsic.lorentzian_psd(n, omega_r)
    rho = intrinsic.autocorrelation_kernel(psd)
    assert float(rho[0]) == pytest.approx(1.0)
    back = torch.fft.fft(rho.to(torch.complex128))
    assert float(back.imag.abs().max()) < 1e-10
    ratio = back.real / psd
    torch.testing.assert_close(ratio, torch.full_like(ratio, float(ratio[0])), rtol=1e-10, atol=1e-12)
    assert float(rho[1]) < 1.0 and float(rho[1]) > float(rho[3])  # decays with the lag


def test_anticausal_credit_matches_the_direct_sum_and_respects_lengths():
    g = torch.Generator().manual_seed(0)
    t_max, batch = 12, 6
    nov = torch.rand(t_max, batch, generator=g, dtype=torch.float64)
    lengths = torch.tensor([1, 3, 12, 7, 5, 2])
    rho = intrinsic.autocorrelation_kernel(intrinsic.lorentzian_psd(t_max, 0.1))
    got = intrinsic.anticausal_credit(nov, lengths, rho)
    for b in range(batch):
        n = int(lengths[b])
        for t in range(t_max):
            want = sum(float(rho[l]) * float(nov[t + l, b]) for l in range(n - t)) if t < n else 0.0
            assert float(got[t, b]) == pytest.approx(want, abs=1e-10)


def test_annealing_reaches_zero_at_the_chosen_fraction_and_novelty_decays():
    assert intrinsic.annealed_beta(0.5, 0, 100) == pytest.approx(0.5)
    assert intrinsic.annealed_beta(0.5, 25, 100) == pytest.approx(0.25)
    assert intrinsic.annealed_beta(0.5, 50, 100) == 0.0
    assert intrinsic.annealed_beta(0.5, 99, 100) == 0.0
    nov = intrinsic.novelty(torch.tensor([0, 3, 99]))
    torch.testing.assert_close(nov, torch.tensor([1.0, 0.5, 0.1], dtype=torch.float64))


# --- 10.5 the enumerable 2x2 toy DAG --------------------------------------------------------------
# States A=(0,0), B=(0,1), C=(1,0), D=(1,1); every state may exit and is an object x.

TOY_R = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)


def toy_residuals(p: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Per-step residuals (exit included) of the five complete trajectories of the toy DAG."""
    lpa = torch.log_softmax(p["pf_a"], 0)  # A -> B, A -> C, A exit
    lpb = torch.log_softmax(p["pf_b"], 0)  # B -> D, B exit
    lpc = torch.log_softmax(p["pf_c"], 0)  # C -> D, C exit
    lpd = torch.log_softmax(p["pb_d"], 0)  # P_B(B | D), P_B(C | D)
    z, fb, fc, fd = p["log_z"], p["log_f"][0], p["log_f"][1], p["log_f"][2]
    lr = torch.log(TOY_R)
    return [
        torch.stack([z + lpa[2] - lr[0]]),
        torch.stack([z + lpa[0] - fb, fb + lpb[1] - lr[1]]),
        torch.stack([z + lpa[1] - fc, fc + lpc[1] - lr[2]]),
        torch.stack([z + lpa[0] - fb, fb + lpb[0] - fd - lpd[0], fd - lr[3]]),
        torch.stack([z + lpa[1] - fc, fc + lpc[0] - fd - lpd[1], fd - lr[3]]),
    ]


def toy_terminal_pmf(p: dict[str, torch.Tensor]) -> torch.Tensor:
    pa, pb, pc = (torch.softmax(p[k], 0) for k in ("pf_a", "pf_b", "pf_c"))
    return torch.stack([pa[2], pa[0] * pb[1], pa[1] * pc[1], pa[0] * pb[0] + pa[1] * pc[0]])


@pytest.mark.parametrize(
    "weight",
    [
        spectral.tikhonov(0.0),
        spectral.tikhonov(2.0),
        spectral.tikhonov(8.0),
        spectral.butterworth(0.25),
        spectral.dc_only(),
    ],
    ids=["lam0", "lam2", "lam8", "butterworth", "dc"],
)
def test_exact_minimiser_of_the_spectral_loss_samples_r_over_z(weight):
    g = torch.Generator().manual_seed(0)
    shapes = {"pf_a": 3, "pf_b": 2, "pf_c": 2, "pb_d": 2, "log_f": 3, "log_z": 1}
    p = {k: torch.randn(n, dtype=torch.float64, generator=g).requires_grad_() for k, n in shapes.items()}
    p["log_z"] = p["log_z"][0].detach().requires_grad_()
    opt = torch.optim.LBFGS(
        list(p.values()),
        lr=1.0,
        max_iter=500,
        tolerance_grad=1e-14,
        tolerance_change=1e-16,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = sum(spectral.spectral_energy(d[None, :], weight)[0] for d in toy_residuals(p))
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    assert float(closure()) < 1e-12
    torch.testing.assert_close(toy_terminal_pmf(p).detach(), TOY_R / TOY_R.sum(), rtol=1e-5, atol=1e-6)
    assert float(p["log_z"]) == pytest.approx(math.log(float(TOY_R.sum())), abs=1e-5)
