"""Why LV loses credal_dro's geographic regression (issue 54): calibration of eps, the central law and the bulk,
and the solver's status, measured on the pipeline's own data, bulks and central samples.

For every seed of the scale's regression it rebuilds the splits and bulks with the pipeline's `prepare` stage and
the central samples with `fitting`'s seed, then prints four tables:
1. eps sweep: the LV decision at each eps of the config grid plus a finer low end; per eps the validation score the
   pipeline minimises (worst select band MAE), the test MAE, ||theta|| relative to ERM-LAD's, how often validation
   picks it and how often it is the best on the test set; beside them ERM-LAD's test MAE and the test-oracle eps's
   gap to it (the best LV could do if eps were chosen on the test set itself).
2. central law at eps = 0: LAD fitted on the fit split (ERM-LAD), on the fit split truncated to the bulk, on all
   Gaussian-copula samples, on the copula samples inside the bulk (= LV at eps = 0) and inside each of its two blocks
   alone (X ellipsoid, Y interval), by test MAE and slope norm.
3. bulk: coverage of the joint bulk and of each block (X ellipsoid, Y interval) on fit, select, test and the central
   samples, against 1 - gamma (joint) and 1 - gamma / 2 (each block).
4. solver: cvxpy status and iteration counts of every LV solve.
Usage, from the repository root:

    .venv/bin/python tools/diagnose/credal_dro_regression.py [--scale cpu] [--extra-eps 0.005 0.01 0.02]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import stats

from paperflow.core.config import load_paper_config
from paperflow.credal_dro import prepare
from paperflow.credal_dro import regression as rg
from paperflow.credal_dro.bulk import Bulk
from paperflow.credal_dro.central import sample_central
from paperflow.credal_dro.fitting import CENTRAL_SEED_OFFSET
from paperflow.credal_dro.settings import seeds_of
from paperflow.credal_dro.solvers import solve
from paperflow.credal_dro.tables import features, load_splits


def mean_ci(values: list[float]) -> str:
    """Mean and a 95 % t half-width over seeds."""
    a = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else float("nan")
    return f"{a.mean():.3f} ± {half:.3f}"


def build(scale: str, work: Path) -> tuple[dict, dict, dict]:
    cfg = load_paper_config("credal_dro", scale)
    rcfg = cfg["regression"]
    seeds = seeds_of(cfg, "regression")
    raw, splits, bulks = work / "raw.parquet", work / "splits.parquet", work / "bulks.json"
    prepare.download("regression", rcfg, seeds, work / "cache", raw)
    prepare.preprocess("regression", raw, rcfg, seeds, splits, bulks)
    return cfg, load_splits(splits), json.loads(bulks.read_text())


def measure(scale: str, extra_eps: list[float]) -> dict:
    """Every measurement, per seed, on the pipeline's own splits, bulks and central samples."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, splits, bulks = build(scale, Path(tmp))
    rcfg, solver = cfg["regression"], cfg["solver"]["conic"]
    grid = sorted(set(rcfg["methods"]["lv"]) | set(extra_eps))
    sweep = {e: {"select": [], "test": [], "norm": [], "picked": 0, "picked_fine": 0, "oracle": 0} for e in grid}
    out = {"scale": scale, "seeds": len(splits), "gamma": rcfg["bulk"]["gamma"], "config_grid": rcfg["methods"]["lv"]}
    erm_test, oracle_gap, central_rows, coverage, status, iters = [], [], {}, {}, Counter(), []
    for seed, parts in splits.items():
        bulk = Bulk.from_json(bulks[str(seed)])
        x_block, y_block = bulk.blocks
        fit, select, test = (features(parts[p]) for p in ("fit", "select", "test"))
        u_select = parts["select"]["u"].to_numpy()
        central = sample_central(
            rcfg["central"], fit, rcfg["n_central"], np.random.default_rng(CENTRAL_SEED_OFFSET + seed)
        )
        eth, eth0 = rg.erm_lad(fit, solver)
        erm_test.append(rg.abs_errors(eth, eth0, test).mean())
        erm_norm = np.linalg.norm(eth)
        scores = {}
        for eps in grid:
            problem, theta, theta0 = rg.lv_lad_problem(central, bulk, eps)
            solve(problem, solver)
            status[problem.status] += 1
            iters.append(problem.solver_stats.num_iters)
            th, th0 = np.asarray(theta.value), float(theta0.value)
            scores[eps] = rg.worst_block_mae(th, th0, select, u_select, rcfg["validation_blocks"])
            sweep[eps]["select"].append(scores[eps])
            sweep[eps]["test"].append(rg.abs_errors(th, th0, test).mean())
            sweep[eps]["norm"].append(np.linalg.norm(th) / erm_norm)
        sweep[min(rcfg["methods"]["lv"], key=scores.get)]["picked"] += 1
        sweep[min(grid, key=scores.get)]["picked_fine"] += 1
        oracle = min(grid, key=lambda e: sweep[e]["test"][-1])
        sweep[oracle]["oracle"] += 1
        oracle_gap.append(sweep[oracle]["test"][-1] - erm_test[-1])
        for name, data in {
            "ERM-LAD: fit split": fit,
            "fit split inside the bulk": fit[bulk.contains(fit)],
            "all copula samples": central,
            "copula samples inside the bulk (LV at eps 0)": central[bulk.contains(central)],
            "copula samples inside the X ellipsoid only": central[x_block.score(central) <= x_block.t],
            "copula samples inside the Y interval only": central[y_block.score(central) <= y_block.t],
        }.items():
            th, th0 = rg.erm_lad(data, solver)
            row = central_rows.setdefault(name, {"test": [], "norm": [], "n": []})
            row["test"].append(rg.abs_errors(th, th0, test).mean())
            row["norm"].append(np.linalg.norm(th) / erm_norm)
            row["n"].append(len(data))
        for part, data in {"fit": fit, "select": select, "test": test, "central": central}.items():
            cov = coverage.setdefault(part, {"joint": [], "X ellipsoid": [], "Y interval": []})
            cov["joint"].append(bulk.contains(data).mean())
            cov["X ellipsoid"].append((x_block.score(data) <= x_block.t).mean())
            cov["Y interval"].append((y_block.score(data) <= y_block.t).mean())
    return out | {
        "erm_test": erm_test,
        "sweep": sweep,
        "oracle_gap": oracle_gap,
        "central": central_rows,
        "coverage": coverage,
        "solver": solver,
        "status": dict(status),
        "iterations": iters,
    }


def render(res: dict) -> str:
    """The four tables as Markdown."""
    erm, gamma = np.asarray(res["erm_test"]), res["gamma"]
    lines = [
        f"## credal_dro regression at scale {res['scale']}: {res['seeds']} seeds, mean ± 95 % t half-width over seeds",
        "",
        f"ERM-LAD test MAE: {mean_ci(res['erm_test'])}",
        "",
        "| eps | in config grid | select worst-band MAE | test MAE | test MAE - ERM-LAD | ||theta|| / ERM's "
        "| picked (config grid) | picked (with the finer eps) | best on test |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for eps, s in res["sweep"].items():
        lines.append(
            f"| {eps:g} | {'yes' if eps in res['config_grid'] else 'no'} | {mean_ci(s['select'])} "
            f"| {mean_ci(s['test'])} | {mean_ci(list(np.asarray(s['test']) - erm))} | {mean_ci(s['norm'])} "
            f"| {s['picked']} | {s['picked_fine']} | {s['oracle']} |"
        )
    lines += [
        "",
        f"Test-oracle eps (best LV on the test set, per seed) minus ERM-LAD: {mean_ci(res['oracle_gap'])}",
        "",
        "| LAD fitted on | rows | test MAE | test MAE - ERM-LAD | ||theta|| / ERM's |",
        "|---|---|---|---|---|",
    ]
    for name, row in res["central"].items():
        lines.append(
            f"| {name} | {np.mean(row['n']):.0f} | {mean_ci(row['test'])} "
            f"| {mean_ci(list(np.asarray(row['test']) - erm))} | {mean_ci(row['norm'])} |"
        )
    lines += [
        "",
        f"| share inside | joint bulk (bound {1 - gamma:g}) | X ellipsoid (bound {1 - gamma / 2:g}) "
        f"| Y interval (bound {1 - gamma / 2:g}) |",
        "|---|---|---|---|",
    ]
    for part, cov in res["coverage"].items():
        lines.append(
            f"| {part} | {mean_ci(cov['joint'])} | {mean_ci(cov['X ellipsoid'])} | {mean_ci(cov['Y interval'])} |"
        )
    lines += [
        "",
        f"LV solves ({res['solver']}): {sum(res['status'].values())}, status {res['status']}, "
        f"iterations median {np.median(res['iterations']):.0f}, max {max(res['iterations'])}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--extra-eps", type=float, nargs="*", default=[0.005, 0.01, 0.02])
    args = parser.parse_args()
    print(render(measure(args.scale, args.extra_eps)))


if __name__ == "__main__":
    main()
