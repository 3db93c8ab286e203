"""Geographically shifted LAD regression (spec §4, §9): data, the LV block-bulk SOCP and the baselines.

xi = (x, y); loss |y - theta^T x - theta0|, i.e. a = (-theta, 1). Bulk = X-ellipsoid x Y-interval
(a block bulk), so sup_{Xi0} loss = |mu_y - theta^T mu_x - theta0| + t_X ||Sigma_X^{1/2} theta|| + t_Y w_Y.
Baselines: ERM-LAD (cvxpy), ridge (scikit-learn), CVaR-DRO, Wasserstein-DRO and OR-WDRO (LAD) from `dro`.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cvxpy as cp
import numpy as np
import pandas as pd
from sklearn.linear_model import Ridge

from paperflow.core.refs import dro_linear_model
from paperflow.credal_dro.bulk import Bulk
from paperflow.credal_dro.lv import support_expr
from paperflow.credal_dro.solvers import solve

CALIFORNIA_FEATURES = ["MedInc", "HouseAge", "AveRooms", "AveBedrms", "Population", "AveOccup", "Latitude", "Longitude"]


def synthetic_geo(n: int, dim: int, drift: float, df: float, rng: np.random.Generator) -> pd.DataFrame:
    """A longitude-like axis u ~ U(0, 1), covariates correlated with u, y = beta(u)^T x + t_df noise with
    beta drifting along u (spec §4 offline stand-in)."""
    u = rng.random(n)
    x = rng.standard_normal((n, dim)) + np.outer(u, np.linspace(1.0, -1.0, dim))
    beta0 = np.linspace(1.0, 0.2, dim)
    beta = beta0 + drift * np.outer(u, np.sign(np.arange(dim) % 2 - 0.5))
    y = np.sum(beta * x, axis=1) + 1.0 + rng.standard_t(df, n)
    return pd.DataFrame({"u": u, **{f"f{j}": x[:, j] for j in range(dim)}, "y": y})


def read_california(archive: str | Path) -> pd.DataFrame:
    """The StatLib archive (cal_housing.tgz) as scikit-learn's fetch_california_housing builds it; the
    target in units of 1e4 dollars (sklearn's 1e5 times 10); u = -Longitude so that 'east' is low u."""
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("cal_housing.data"))
        raw = np.loadtxt(io.BytesIO(tar.extractfile(member).read()), delimiter=",")
    lon, lat, age, rooms, bedrooms, pop, households, income, value = raw.T
    feats = np.column_stack([income, age, rooms / households, bedrooms / households, pop, pop / households, lat, lon])
    frame = pd.DataFrame(feats, columns=[f"f{j}" for j in range(8)])
    return frame.assign(u=-lon, y=value / 1e4)


def geo_split(
    frame: pd.DataFrame, seed: int, train_frac: float, gap: float, select_frac: float
) -> dict[str, np.ndarray]:
    """Low-u `train_frac` -> fit / select (random, `select_frac` to select); high-u remainder after a
    `gap` band -> test. Features standardised with the fit split's moments; y unchanged."""
    order = np.argsort(frame["u"].to_numpy(), kind="stable")
    n = len(order)
    n_train, n_gap = int(round(train_frac * n)), int(round(gap * n))
    train, test = order[:n_train], order[n_train + n_gap :]
    train = np.random.default_rng(seed).permutation(train)
    n_sel = int(round(select_frac * len(train)))
    cols = [c for c in frame.columns if c.startswith("f")]
    xy = frame[cols + ["y"]].to_numpy(dtype=float)
    fit, select = xy[train[n_sel:]], xy[train[:n_sel]]
    mean, std = fit[:, :-1].mean(axis=0), fit[:, :-1].std(axis=0) + 1e-12
    scale = lambda a: np.column_stack([(a[:, :-1] - mean) / std, a[:, -1]])  # noqa: E731
    u = frame["u"].to_numpy()
    return {
        "fit": scale(fit),
        "select": scale(select),
        "test": scale(xy[test]),
        "u_select": u[train[:n_sel]],
        "u_test": u[test],
    }


def abs_errors(theta: np.ndarray, theta0: float, xy: np.ndarray) -> np.ndarray:
    return np.abs(xy[:, -1] - xy[:, :-1] @ theta - theta0)


def lv_lad_problem(central: np.ndarray, bulk: Bulk, eps: float) -> tuple[cp.Problem, cp.Variable, cp.Variable]:
    """The LV LAD problem (an SOCP) and its (theta, theta0) variables:
    min (1 - eps) mean_{central in Xi0} |y - theta^T x - theta0| + eps sup_{Xi0} |...|."""
    inside = central[bulk.contains(central)]
    d = central.shape[1] - 1
    theta, theta0 = cp.Variable(d), cp.Variable()
    r = cp.Variable(len(inside))
    resid = inside[:, -1] - inside[:, :-1] @ theta - theta0
    a = cp.hstack([-theta, np.ones(1)])
    mu = bulk.mu
    c = cp.Variable()
    centre = mu[-1] - mu[:-1] @ theta - theta0
    sup = c + support_expr(bulk, a)
    cons = [r >= resid, r >= -resid, c >= centre, c >= -centre]
    return cp.Problem(cp.Minimize((1 - eps) * cp.sum(r) / len(inside) + eps * sup), cons), theta, theta0


def lv_lad(central: np.ndarray, bulk: Bulk, eps: float, solver: str) -> tuple[np.ndarray, float]:
    """The LV decision: `lv_lad_problem` solved by `solver`."""
    problem, theta, theta0 = lv_lad_problem(central, bulk, eps)
    solve(problem, solver)
    return np.asarray(theta.value), float(theta0.value)


def erm_lad(xy: np.ndarray, solver: str) -> tuple[np.ndarray, float]:
    theta, theta0 = cp.Variable(xy.shape[1] - 1), cp.Variable()
    r = cp.Variable(len(xy))
    resid = xy[:, -1] - xy[:, :-1] @ theta - theta0
    solve(cp.Problem(cp.Minimize(cp.sum(r) / len(xy)), [r >= resid, r >= -resid]), solver)
    return np.asarray(theta.value), float(theta0.value)


def ridge(xy: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    model = Ridge(alpha=alpha).fit(xy[:, :-1], xy[:, -1])
    return np.asarray(model.coef_), float(model.intercept_)


def dro_baseline(
    kind: str, xy: np.ndarray, value: float, solver: str, or_eta: float | None
) -> tuple[np.ndarray, float]:
    """CVaR-DRO (alpha = value), Wasserstein-DRO (eps = value, p = 1, kappa = inf) or outlier-robust
    Wasserstein-DRO (Nietert et al. 2023; eps = value, outlier fraction `or_eta`, used by or_wass only) with
    LAD loss, from `dro`.
    `dro.ORWDRO` has no intercept: y is centred at its median, which becomes theta0."""
    lm = dro_linear_model()
    d = xy.shape[1] - 1
    if kind == "or_wass":
        centre = float(np.median(xy[:, -1]))
        model = lm.ORWDRO(input_dim=d, model_type="lad", solver=solver, eps=value, eta=or_eta)
        return np.asarray(model.fit(xy[:, :-1], xy[:, -1] - centre)["theta"], dtype=float), centre
    if kind == "cvar":
        model = lm.CVaRDRO(input_dim=d, model_type="lad", solver=solver, alpha=value)
    elif kind == "wass":
        model = lm.WassersteinDRO(input_dim=d, model_type="lad", solver=solver)
        model.update({"eps": value})
    else:
        raise ValueError(f"unknown dro baseline {kind!r}")
    params = model.fit(xy[:, :-1], xy[:, -1])
    return np.asarray(params["theta"], dtype=float), float(params["b"])


def worst_block_mae(theta: np.ndarray, theta0: float, xy: np.ndarray, u: np.ndarray, n_blocks: int) -> float:
    """Minimax validation [R]: the select split cut into `n_blocks` bands of u; the worst band's MAE."""
    bands = np.array_split(np.argsort(u, kind="stable"), n_blocks)
    return max(float(abs_errors(theta, theta0, xy[idx]).mean()) for idx in bands)


def fit_method(
    method: str,
    grid: list[float],
    split: Mapping[str, np.ndarray],
    central: np.ndarray | None,
    bulk: Bulk | None,
    cfg: Mapping[str, Any],
) -> dict:
    """Fit every grid value on the fit split, pick the one with the smallest worst-band select MAE."""
    solver, fit = cfg["solver"], split["fit"]
    t0 = time.perf_counter()
    fits = []
    for value in grid:
        if method == "lv":
            theta, theta0 = lv_lad(central, bulk, value, solver)
        elif method == "erm_lad":
            theta, theta0 = erm_lad(fit, solver)
        elif method == "ridge":
            theta, theta0 = ridge(fit, value)
        else:
            theta, theta0 = dro_baseline(method, fit, value, solver, cfg["or_wass_eta"])
        score = worst_block_mae(theta, theta0, split["select"], split["u_select"], cfg["validation_blocks"])
        fits.append({"param": float(value), "theta": theta.tolist(), "theta0": theta0, "select_worst_mae": score})
    best = min(fits, key=lambda f: f["select_worst_mae"])
    return {"grid": fits, "chosen": best, "runtime_s": time.perf_counter() - t0}
