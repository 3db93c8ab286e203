"""The closed form of LOZO+'s capture ratio at a refresh step (paperflow.lozo_plus.ceiling) against Monte Carlo."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from paperflow.lozo_plus import ceiling, training, zo


def test_selection_moments_match_order_statistics_sampled():
    rng = np.random.default_rng(0)
    x = -np.sort(-np.abs(rng.standard_normal((400_000, 8))), axis=1)
    kept2 = x[:, 1] >= 0.5 * x[:, 0]
    ex, es = ceiling.selection_moments(8, 0.5, 2)
    assert ex == pytest.approx(np.mean(x[:, 0] ** 2 + kept2 * x[:, 1] ** 2), rel=5e-3)
    assert es == pytest.approx(1 + kept2.mean(), rel=5e-3)
    kept = x >= 0.3 * x[:, :1]
    kept[:, 3:] = False
    ex, es = ceiling.selection_moments(8, 0.3, 3)
    assert ex == pytest.approx(np.mean((x**2 * kept).sum(1)), rel=5e-3)
    assert es == pytest.approx(kept.sum(1).mean(), rel=5e-3)


def test_selection_moments_special_cases():
    assert ceiling.selection_moments(6, 0.0, 6) == pytest.approx((6.0, 6.0), rel=1e-4)  # every candidate: E sum x^2
    assert ceiling.selection_moments(1, 0.5, 2) == pytest.approx((1.0, 1.0), rel=1e-4)  # one candidate: E x^2
    with pytest.raises(ValueError, match="candidates"):
        ceiling.selection_moments(0, 0.5, 2)


def test_alignment_is_the_expected_share_of_a_gaussian_weighted_sum():
    e = np.array([5.0, 1.0, 0.3, 0.01])
    a = np.random.default_rng(1).standard_normal((400_000, 4)) ** 2 * e
    np.testing.assert_allclose(ceiling.alignment(e), (a / a.sum(1, keepdims=True)).mean(0), rtol=1e-2, atol=1e-4)
    np.testing.assert_allclose(ceiling.alignment([2.0] * 5), [0.2] * 5, rtol=1e-6)
    assert ceiling.alignment([1.0, 0.0])[1] == 0.0


def _gradients(spectra, shapes, g):
    out = []
    for (m, n), s in zip(shapes, spectra):
        k = min(m, n)
        a, _ = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))
        b, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
        sv = torch.zeros(k, dtype=torch.float64)
        sv[: len(s)] = torch.tensor(s, dtype=torch.float64)
        out.append(a @ torch.diag(sv) @ b.T)
    return out


def _monte_carlo(grads, settings: zo.Settings, draws: int, seed: int) -> float:
    """LOZO+'s own selection (`LOZOPlus.choose`) on exact scores u^T G v_k of a static gradient with one shared probe
    per matrix, its kept columns' capture ratio (`zo.capture_ratio`) over a fresh rank-r subspace's (rms over draws)."""
    g = torch.Generator().manual_seed(seed)
    opt = zo.LOZOPlus([torch.nn.Parameter(torch.zeros(*x.shape)) for x in grads], settings, seed)
    k = settings.candidates
    u = [torch.randn(draws, x.shape[0], generator=g, dtype=torch.float64) for x in grads]
    v = [torch.randn(draws, k, x.shape[1], generator=g, dtype=torch.float64) for x in grads]
    scores = sum(torch.einsum("dm,mn,dkn->dk", uu, x, vv) for uu, x, vv in zip(u, grads, v)).numpy()
    ours, lozo = [], []
    for d in range(draws):
        opt.t = d
        kept = opt.choose(scores[d]).kept
        ours.append(zo.capture_ratio(grads, [vv[d, kept].T for vv in v])[0])
        fresh = [torch.randn(x.shape[1], settings.rank, generator=g, dtype=torch.float64) for x in grads]
        lozo.append(zo.capture_ratio(grads, fresh)[0])
    return ceiling.rms(ours) / ceiling.rms(lozo)


@pytest.mark.parametrize(
    "spectra",
    [[[1.0]], [[1.0], [1.0]], [[1.0, 0.5, 0.2], [0.7, 0.1], [0.3]]],
    ids=["one-matrix-rank-1", "two-equal-matrices", "mixed"],
)
def test_closed_form_matches_a_monte_carlo_of_the_selection(spectra):
    torch.set_num_threads(1)
    shapes = [(40, 64)] * len(spectra)
    grads = _gradients(spectra, shapes, torch.Generator().manual_seed(0))
    s = zo.Settings(lr=1.0, candidates=8, kappa=0.5, r_max=2, rank=2)
    e, n = ceiling.components(grads)
    want = ceiling.rho_ratio(e, n, s.candidates, s.kappa, s.r_max, s.rank)
    assert _monte_carlo(grads, s, 1500, 1) == pytest.approx(want, rel=0.04)
    # the random-candidate control: as many columns, no selection
    random = _monte_carlo(grads, replace(s, selection="random"), 1500, 2)
    assert random == pytest.approx(ceiling.random_rho_ratio(8, 0.5, 2, 2), rel=0.04)
    assert want > 1.1 * random


def test_more_candidates_raise_the_closed_form_and_more_matrices_lower_it():
    one, two = [1.0], [1.0, 1.0]
    n1, n2 = [64.0], [64.0, 64.0]
    assert ceiling.rho_ratio(one, n1, 16, 0.5, 2, 2) > ceiling.rho_ratio(one, n1, 8, 0.5, 2, 2)
    assert ceiling.rho_ratio(two, n2, 8, 0.5, 2, 2) < ceiling.rho_ratio(one, n1, 8, 0.5, 2, 2)


def test_spectrum_row_summarises_the_gradient():
    g = torch.Generator().manual_seed(3)
    grads = _gradients([[3.0], [1.0, 1.0]], [(20, 32), (32, 32)], g)
    row = training.spectrum_row([x.float() for x in grads], zo.Settings(lr=1.0))
    assert row["spectrum_largest_matrix_share"] == pytest.approx(9 / 11, rel=1e-5)
    assert row["spectrum_top1_share"] == pytest.approx(10 / 11, rel=1e-5)
    assert row["spectrum_matrices_participation"] == pytest.approx(121 / 85, rel=1e-5)
    e, n = ceiling.components(grads)
    assert row["rho_ratio_closed_form"] == pytest.approx(ceiling.rho_ratio(e, n, 8, 0.5, 2, 2), rel=1e-5)
    assert np.isnan(training.spectrum_row(grads, zo.Settings(lr=1.0, threshold_mode="ema"))["rho_ratio_closed_form"])
