"""credal_dro acceptance checks of spec §10: Thm 2.1 as an LP over a discretised bulk, the closed-form
sups against numerical maxima, the CVaR / TV identities, the DKW coverage simulation, the reductions
at eps = 0 and eps = 1 (and gamma -> 0), and the baselines against the `dro` package on the same data."""

from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest
from scipy import stats
from scipy.optimize import linprog

from paperflow.core.refs import dro_linear_model
from paperflow.credal_dro import newsvendor as nv
from paperflow.credal_dro import regression as rg
from paperflow.credal_dro.bulk import Block, Bulk, calibrate, dkw_radius, dkw_threshold
from paperflow.credal_dro.central import sample_central
from paperflow.credal_dro.lv import (
    cvar_expr,
    kl_dual,
    lv_value,
    sup_abs,
    sup_linear,
    sup_piecewise,
    sup_relu,
    support_expr,
    tv_ball_value,
    upper_tail_mean,
)
from paperflow.credal_dro.solvers import solve

H, B = 1.0, 3.0


def random_bulk(rng: np.random.Generator, d: int, kind: str) -> Bulk:
    mu = rng.normal(size=d)
    if kind == "ellipsoid":
        a = rng.normal(size=(d, d))
        blocks = (Block("ellipsoid", tuple(range(d)), mu, a @ a.T + 0.5 * np.eye(d), float(rng.uniform(0.5, 3))),)
    elif kind == "box":
        blocks = (Block("box", tuple(range(d)), mu, rng.uniform(0.2, 2, d), float(rng.uniform(0.5, 3))),)
    else:  # ellipsoid on the first d-1 coordinates x box on the last (the regression geometry)
        a = rng.normal(size=(d - 1, d - 1))
        blocks = (
            Block("ellipsoid", tuple(range(d - 1)), mu[:-1], a @ a.T + 0.5 * np.eye(d - 1), float(rng.uniform(0.5, 3))),
            Block("box", (d - 1,), mu[-1:], rng.uniform(0.2, 2, 1), float(rng.uniform(0.5, 3))),
        )
    return Bulk(blocks, gamma=0.1, delta=0.1, m_select=0)


def numerical_max(bulk: Bulk, a: np.ndarray, b: float) -> float:
    """max of a^T xi + b over the bulk by cvxpy (Clarabel), written from the set's definition."""
    xi = cp.Variable(bulk.dim)
    cons = []
    for blk in bulk.blocks:
        z = xi[list(blk.idx)] - blk.mu
        if blk.geometry == "ellipsoid":
            cons.append(cp.norm(np.linalg.solve(np.linalg.cholesky(blk.shape), np.eye(len(blk.idx))) @ z, 2) <= blk.t)
        else:
            cons.append(cp.abs(z) <= blk.t * blk.shape)
    return solve(cp.Problem(cp.Maximize(a @ xi + b), cons), "CLARABEL")


# §10.1 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35, 1.0])
def test_thm21_lp_over_discretised_bulk_equals_mean_plus_sup(eps):
    rng = np.random.default_rng(1)
    lo, hi = np.full(3, 14.0), np.full(3, 26.0)
    corners = np.array(list(itertools.product(*zip(lo, hi))))
    points = np.vstack([rng.uniform(lo, hi, size=(200, 3)), corners])  # K points covering the box bulk
    x = np.array([19.0, 21.0, 23.5])
    f = nv.cost(x, points, H, B)
    p = np.zeros(len(points))
    p[:150] = rng.dirichlet(np.ones(150))  # P_{c,Xi0}: on the bulk's interior points
    # maximise sum_k ((1 - eps) p_k + eps R_k) f_k over R in the simplex
    res = linprog(-eps * f, A_eq=np.ones((1, len(f))), b_eq=[1.0], bounds=(0, None), method="highs")
    lp_value = (1 - eps) * p @ f - res.fun
    closed = (1 - eps) * p @ f + eps * nv.sup_cost_box(x, lo, hi, H, B)
    assert lp_value == pytest.approx(closed, abs=1e-8, rel=1e-10)
    if eps > 0:  # Cor 2.2: a point mass at the maximiser
        assert res.x.max() == pytest.approx(1.0) and f[np.argmax(res.x)] == pytest.approx(f.max())
    assert lv_value(f[:150], f.max(), eps) == pytest.approx((1 - eps) * f[:150].mean() + eps * f.max())


def test_newsvendor_box_sup_is_a_corner_maximum():
    rng = np.random.default_rng(2)
    lo, hi = rng.uniform(5, 15, 4), rng.uniform(20, 30, 4)
    corners = np.array(list(itertools.product(*zip(lo, hi))))
    for x in rng.uniform(0, 35, size=(20, 4)):
        assert nv.sup_cost_box(x, lo, hi, H, B) == pytest.approx(nv.cost(x, corners, H, B).max(), rel=1e-12)


# §10.2 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ellipsoid", "box", "block"])
def test_closed_form_sups_match_numerical_maxima(kind):
    rng = np.random.default_rng({"ellipsoid": 3, "box": 4, "block": 5}[kind])
    for _ in range(4):
        bulk = random_bulk(rng, 4, kind)
        a, b = rng.normal(size=4), float(rng.normal())
        top, bottom = numerical_max(bulk, a, b), -numerical_max(bulk, -a, -b)
        assert sup_linear(bulk, a, b) == pytest.approx(top, rel=1e-6)
        assert sup_relu(bulk, a, b) == pytest.approx(max(0.0, top), rel=1e-6, abs=1e-9)
        assert sup_abs(bulk, a, b) == pytest.approx(max(top, -bottom), rel=1e-6)
        pieces, offsets = rng.normal(size=(3, 4)), rng.normal(size=3)
        numeric = max(numerical_max(bulk, pa, pb) for pa, pb in zip(pieces, offsets))
        assert sup_piecewise(bulk, pieces, offsets) == pytest.approx(numeric, rel=1e-6)
        # the cvxpy form used inside the decision problems agrees with the numpy form
        assert support_expr(bulk, cp.Constant(a)).value == pytest.approx(bulk.support(a), rel=1e-9)


def test_relu_sup_is_zero_when_the_bulk_is_below_the_kink():
    bulk = random_bulk(np.random.default_rng(6), 3, "box")
    a = np.ones(3)
    b = -(a @ bulk.mu) - bulk.support(a) - 1.0
    assert sup_relu(bulk, a, b) == 0.0 and sup_linear(bulk, a, b) == pytest.approx(-1.0)


# §10.3 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.05, 0.3, 0.7])
def test_reverse_lv_is_upper_tail_mean_and_tv_ball_is_mixture(eps):
    rng = np.random.default_rng(7)
    f, p = rng.normal(size=40) ** 2, rng.dirichlet(np.ones(40))
    n = len(f)
    # reverse LV: Q <= P / (1 - eps), Q in the simplex
    res = linprog(-f, A_eq=np.ones((1, n)), b_eq=[1.0], bounds=list(zip(np.zeros(n), p / (1 - eps))), method="highs")
    assert -res.fun == pytest.approx(upper_tail_mean(f, p, 1 - eps), rel=1e-9)
    # TV ball: 0.5 ||Q - P||_1 <= eps, Q in the simplex; variables (Q, u) with u >= |Q - P|
    c = np.concatenate([-f, np.zeros(n)])
    a_ub = np.block([[np.eye(n), -np.eye(n)], [-np.eye(n), -np.eye(n)], [np.zeros((1, n)), 0.5 * np.ones((1, n))]])
    b_ub = np.concatenate([p, -p, [eps]])
    res = linprog(
        c,
        A_ub=a_ub,
        b_ub=b_ub,
        A_eq=np.concatenate([np.ones(n), np.zeros(n)])[None],
        b_eq=[1.0],
        bounds=(0, None),
        method="highs",
    )
    assert -res.fun == pytest.approx(tv_ball_value(f, p, eps), rel=1e-9)
    assert tv_ball_value(f, p, eps) == pytest.approx((1 - eps) * upper_tail_mean(f, p, 1 - eps) + eps * f.max())


def test_rockafellar_uryasev_cvar_equals_upper_tail_mean():
    f = np.random.default_rng(8).exponential(size=50)
    for alpha in (0.1, 0.26, 1.0):
        value, cons = cvar_expr(cp.Constant(f), alpha)
        assert solve(cp.Problem(cp.Minimize(value), cons), "CLARABEL") == pytest.approx(
            upper_tail_mean(f, np.full(50, 0.02), alpha), rel=1e-6
        )


def test_forward_lv_set_is_the_lv_ball():
    """Prop 2.3: Q = (1 - eps) P + eps R has LV(Q, P) = sup_A (P(A) - Q(A)) / P(A) <= eps, and a Q
    that puts less than (1 - eps) of P's mass on an atom leaves the ball."""
    rng = np.random.default_rng(9)
    p = rng.dirichlet(np.ones(6))
    lv = lambda q: max(
        (p[list(s)].sum() - q[list(s)].sum()) / p[list(s)].sum()  # noqa: E731
        for r in range(1, 7)
        for s in itertools.combinations(range(6), r)
    )
    for eps in (0.1, 0.4):
        q = (1 - eps) * p + eps * rng.dirichlet(np.ones(6))
        assert lv(q) <= eps + 1e-12
        outside = q.copy()
        outside[0] = (1 - eps) * p[0] * 0.5
        outside[1:] += (q[0] - outside[0]) / 5
        assert lv(outside) > eps


# §10.4 -------------------------------------------------------------------------------------------


def _coverage_of_thresholds(scores: np.ndarray, truth_cdf, gamma: float, delta: float, radius: bool = True) -> float:
    if radius:
        t = np.array([dkw_threshold(row, gamma, delta) for row in scores])
    else:  # negative control: the plain empirical (1 - gamma) quantile, no DKW band
        t = np.quantile(scores, 1 - gamma, axis=1, method="inverted_cdf")
    return float(np.mean(truth_cdf(t) >= 1 - gamma))


@pytest.mark.parametrize("geometry", ["ellipsoid", "box"])
def test_dkw_certificate_coverage(geometry):
    rng = np.random.default_rng(10)
    d, m, gamma, delta = 3, 200, 0.2, 0.1
    xi = rng.standard_normal((1000, m, d))  # 1000 independent selection sets from N(0, I)
    if geometry == "ellipsoid":  # fitted centre 0, shape I: score = ||xi||, chi_3
        scores, cdf = np.linalg.norm(xi, axis=2), lambda t: stats.chi.cdf(t, d)
    else:  # box, w = 1: score = max |xi_i|
        scores, cdf = np.abs(xi).max(axis=2), lambda t: (2 * stats.norm.cdf(t) - 1) ** d
    assert _coverage_of_thresholds(scores, cdf, gamma, delta) >= 1 - delta
    assert _coverage_of_thresholds(scores, cdf, gamma, delta, radius=False) < 1 - delta  # without the band it fails


def test_dkw_threshold_is_the_kth_order_statistic_and_rejects_small_gamma():
    s = np.arange(1, 101, dtype=float)
    r = dkw_radius(100, 0.1)
    assert dkw_threshold(s[::-1], 0.3, 0.1) == float(np.ceil(100 * (0.7 + r)))
    with pytest.raises(ValueError, match="too small"):
        dkw_threshold(s, r / 2, 0.1)


# §10.5 -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def newsvendor_case():
    rng = np.random.default_rng(11)
    cfg = {"loc": 20.0, "scale": 4.0, "df": 3.0, "dim": 4}
    fit, select = nv.demand(100, cfg, rng), nv.demand(100, cfg, rng)
    bulk = calibrate(fit, select, [("box", range(4))], 0.25, 0.1, box_quantile=0.75)
    return np.vstack([fit, select]), bulk


def test_eps0_is_truncated_saa(newsvendor_case):
    central, bulk = newsvendor_case
    inside = central[bulk.contains(central)]
    x_lv, x_saa = nv.solve_lv(central, bulk, 0.0, H, B, "HIGHS"), nv.solve_saa(inside, H, B, "HIGHS")
    assert nv.cost(x_lv, inside, H, B).mean() == pytest.approx(nv.cost(x_saa, inside, H, B).mean(), rel=1e-7)
    assert nv.cost(x_lv, central, H, B).mean() != pytest.approx(
        nv.cost(nv.solve_saa(central, H, B, "HIGHS"), central, H, B).mean(), rel=1e-3
    )


def test_saa_trunc_method_is_lv_at_eps0_and_not_plain_saa(newsvendor_case):
    """The gated comparator "SAA (eps = 0)": the `saa_trunc` method gives LV's decision at eps = 0, and a
    different decision from plain SAA here, where the truncation drops central samples."""
    central, bulk = newsvendor_case
    n_in = int(bulk.contains(central).sum())
    assert 0 < n_in < len(central) and (B / (H + B) * n_in) % 1 != 0  # truncation binds; the quantile is unique
    decide = lambda method, grid: np.asarray(nv.decide(method, grid, central, bulk, H, B, "HIGHS")[0]["x"])  # noqa: E731
    x_trunc, x_lv0, x_saa = decide("saa_trunc", [0.0]), decide("lv", [0.0]), decide("saa", [0.0])
    np.testing.assert_allclose(x_trunc, x_lv0, atol=1e-7)
    inside = central[bulk.contains(central)]
    np.testing.assert_allclose(x_trunc, np.quantile(inside, B / (H + B), axis=0, method="inverted_cdf"), atol=1e-7)
    assert np.abs(x_trunc - x_saa).max() > 0.1


def test_eps1_is_the_worst_case_over_the_bulk(newsvendor_case):
    central, bulk = newsvendor_case
    lo, hi = bulk.box_corners()
    x = nv.solve_lv(central, bulk, 1.0, H, B, "HIGHS")
    np.testing.assert_allclose(x, (H * lo + B * hi) / (H + B), rtol=1e-6)  # minimiser of max(h(x - lo), b(hi - x))


def test_regression_reductions():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((300, 3))
    xy = np.column_stack([x, x @ np.array([1.0, -0.5, 0.2]) + 0.3 + rng.standard_t(3, 300)])
    bulk = calibrate(xy[:150], xy[150:], [("ellipsoid", range(3)), ("box", [3])], 0.3, 0.1, box_quantile=0.75)
    central = sample_central("gcopula", xy[:150], 800, rng)
    inside = central[bulk.contains(central)]
    th, th0 = rg.lv_lad(central, bulk, 0.0, "CLARABEL")
    eth, eth0 = rg.erm_lad(inside, "CLARABEL")
    assert rg.abs_errors(th, th0, inside).mean() == pytest.approx(rg.abs_errors(eth, eth0, inside).mean(), rel=1e-6)
    th, th0 = rg.lv_lad(central, bulk, 1.0, "CLARABEL")  # sup only: theta = 0, theta0 = mu_y
    np.testing.assert_allclose(th, 0.0, atol=1e-6)
    assert th0 == pytest.approx(bulk.mu[-1], abs=1e-6)


def test_small_gamma_on_bounded_data_recovers_the_support():
    """gamma -> 0 on bounded support: the calibrated box covers the support [0, 1]^d (classical bounded
    Huber set), overshooting only by the asymmetry of a box centred at the sample median."""
    rng = np.random.default_rng(13)
    fit, select = rng.random((2000, 2)), rng.random((20000, 2))
    bulk = calibrate(fit, select, [("box", range(2))], dkw_radius(20000, 0.1) + 1e-4, 0.1, box_quantile=0.75)
    lo, hi = bulk.box_corners()
    assert (lo <= 0.002).all() and (hi >= 0.998).all() and (hi - lo <= 1.06).all()
    assert bulk.contains(rng.random((100000, 2))).mean() >= 0.999


# baselines against `dro` on the same data ----------------------------------------------------------


@pytest.fixture(scope="module")
def lad_data():
    rng = np.random.default_rng(14)
    x = rng.standard_normal((120, 3))
    return x, x @ np.array([0.5, -1.0, 2.0]) + 1.0 + rng.standard_t(3, 120)


def _my_lad_objective(x, y, make):
    theta, b = cp.Variable(x.shape[1]), cp.Variable()
    r = cp.Variable(len(y))
    resid = y - x @ theta - b
    objective, cons = make(r)
    return solve(cp.Problem(cp.Minimize(objective), cons + [r >= resid, r >= -resid]), "CLARABEL")


def test_cvar_matches_dro_package(lad_data):
    x, y = lad_data
    model = dro_linear_model().CVaRDRO(input_dim=3, model_type="lad", solver="CLARABEL", alpha=0.2)
    model.fit(x, y)
    assert _my_lad_objective(x, y, lambda r: cvar_expr(r, 0.2)) == pytest.approx(model.robust_obj, rel=1e-5)


def test_kl_matches_dro_package(lad_data):
    x, y = lad_data
    model = dro_linear_model().KLDRO(input_dim=3, model_type="lad", solver="CLARABEL", eps=0.1)
    model.fit(x, y)
    assert _my_lad_objective(x, y, lambda r: kl_dual(r, 0.1)) == pytest.approx(model.robust_obj, rel=1e-4)


def test_wasserstein_baseline_at_zero_radius_is_erm_lad(lad_data):
    x, y = lad_data
    xy = np.column_stack([x, y])
    th, th0 = rg.dro_baseline("wass", xy, 0.0, "CLARABEL", or_eta=None)
    eth, eth0 = rg.erm_lad(xy, "CLARABEL")
    assert rg.abs_errors(th, th0, xy).mean() == pytest.approx(rg.abs_errors(eth, eth0, xy).mean(), rel=1e-6)
    th, th0 = rg.dro_baseline("wass", xy, 0.5, "CLARABEL", or_eta=None)
    assert np.abs(th).max() < np.abs(eth).max()  # the radius shrinks the coefficients


def test_commercial_or_missing_solvers_fail_clearly():
    problem = cp.Problem(cp.Minimize(cp.Variable() ** 2))
    with pytest.raises(ValueError, match="open solvers"):
        solve(problem, "MOSEK")


def test_central_laws_match_the_data_moments():
    rng = np.random.default_rng(15)
    data = rng.multivariate_normal([1.0, -2.0], [[1.0, 0.6], [0.6, 2.0]], size=3000)
    for kind in ("bayes", "gcopula", "empirical"):
        draws = sample_central(kind, data, 20000, rng)
        np.testing.assert_allclose(draws.mean(axis=0), data.mean(axis=0), atol=0.06)
        assert np.corrcoef(draws.T)[0, 1] == pytest.approx(np.corrcoef(data.T)[0, 1], abs=0.05)


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.3])
def test_lv_lad_optimum_is_the_mean_plus_sup_value_of_its_decision(eps):
    """The SOCP's optimal value is Thm 2.1's (1 - eps) in-bulk mean + eps sup_{Xi0} |y - theta^T x - theta0| of the
    decision it returns (sup in closed form, `sup_abs` with a = (-theta, 1), b = -theta0)."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((400, 3))
    xy = np.column_stack([x, x @ np.array([1.0, -0.5, 0.2]) + 0.3 + rng.standard_t(3, 400)])
    bulk = calibrate(xy[:200], xy[200:], [("ellipsoid", range(3)), ("box", [3])], 0.3, 0.1, box_quantile=0.75)
    central = sample_central("gcopula", xy[:200], 600, rng)
    problem, theta, theta0 = rg.lv_lad_problem(central, bulk, eps)
    value = solve(problem, "CLARABEL")
    th, th0 = np.asarray(theta.value), float(theta0.value)
    inside = central[bulk.contains(central)]
    closed = lv_value(rg.abs_errors(th, th0, inside), sup_abs(bulk, np.append(-th, 1.0), -th0), eps)
    assert value == pytest.approx(closed, rel=1e-5)  # Clarabel's default tolerances
    assert problem.status == cp.OPTIMAL


def test_truncating_the_outcome_to_the_bulk_attenuates_the_lad_slope():
    """Why LV at eps = 0 loses the regression (workflows/credal_dro/README.md): the Y interval of the block bulk cuts
    the outcome, which pulls the LAD slope towards 0, while the X ellipsoid alone leaves it unbiased."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((20000, 2))
    xy = np.column_stack([x, x @ np.array([2.0, 1.0]) + rng.standard_t(3, 20000)])
    bulk = calibrate(xy[:10000], xy[10000:], [("ellipsoid", range(2)), ("box", [2])], 0.2, 0.1, box_quantile=0.75)
    x_block, y_block = bulk.blocks
    full = np.linalg.norm(rg.erm_lad(xy, "CLARABEL")[0])
    only_x = np.linalg.norm(rg.erm_lad(xy[x_block.score(xy) <= x_block.t], "CLARABEL")[0])
    only_y = np.linalg.norm(rg.erm_lad(xy[y_block.score(xy) <= y_block.t], "CLARABEL")[0])
    assert only_x == pytest.approx(full, rel=0.03)
    assert only_y < 0.95 * full
