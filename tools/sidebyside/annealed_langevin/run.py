"""Side by side: our annealed-Langevin samplers (paperflow.annealed_langevin) and the official 1-D GMM experiment
(github.com/habring/time-inhom-Langevin, experiment_gmm_1D.py + src/) on the same inputs: the same target, the
same 5000 ground-truth samples (ours, handed to the official script in place of its own torch draw, so both bin
over the same range), the same schedule tau(t) = 0.99 exp(-t/T), the same adaptive step rule, start x0 = -1,
number of particles and t_max, seeds 0, 1, 2 (torch.manual_seed(seed) right before the official sampler loop;
our pipeline's numpy default_rng(seed)).

Nothing of the official code is copied here. The official script is read from the checkout and executed as it
is, except for these line substitutions, each of which must match exactly once (the driver stops otherwise):
N, tmax, the list of horizons T, the `methods` switches (one path per run), and the line that draws the
ground-truth sample (`sample = gmm.sample(N_gt,tau=0.0)` -> our samples). Its `src.algorithms.GeneralAnnealing`
is wrapped to seed torch before the loop and to keep the last iterate (its forward returns nothing); its
deepinv / torchvision imports (the imaging code only) are stubbed. `torchist` (which its callback uses) must be
importable: `pip install --target <dir> torchist==1.0.1` and pass `--deps <dir>`.

Per run: final KL and TV of the last iterate by our metric (paperflow.annealed_langevin.metrics, spec §8) on
both codes' particles, and for the official runs also by its own util.KL / torchist histogram; the number of
EM steps; wall and CPU seconds (user + sys of this process, one torch thread, one BLAS thread). Ours is timed
over grid + sampler + KL curves (the pipeline's preprocess, train and evaluate work), the official code over its
whole script run for that path (grid, sampler loop with its KL/TV callback every 100 iterations, its files).

Our variants: `ours` = the pipeline's drifts (config/annealed_langevin.yaml: stable float64 score, canonical
tempering, code dilation); `ours, score official` = `drift.score: official` (tempering runs also with
`drift.tempering: official`, i.e. every drift as in the official script); `ours, official drifts + noise` = the
same drifts fed the official loop's own noise stream (torch.randn on float32 particles after
torch.manual_seed(seed)), so that what is left between it and the official run is float32 vs float64.

Usage (from the repository root):

    G=/work/.mirror/habring+time-inhom-Langevin/repo   # bare mirror (the fetch tool)
    C=cc426ffbe2f196b9c0913c25b65eb0aa8953f540           # commit used for the README table
    # only the two paths: the mirror lacks the large Annealed_sampling_ICML.pdf (git may still name it in an error)
    mkdir -p /tmp/al_official && git --git-dir=$G archive $C experiment_gmm_1D.py src | tar -x -C /tmp/al_official
    echo $C > /tmp/al_official/COMMIT
    # the committed results (deleted from the repo at b29331f): the last commit that has them
    for T in 1.0; do mkdir -p /tmp/al_committed/T_$T; git --git-dir=$G show \
        9197abc343c1e42bcda8c57facb5a1cb2e9432e1:results/gmm_1d/T_$T/KL_comparison.csv > /tmp/al_committed/T_$T/KL_comparison.csv; done
    pip install --target /tmp/al_deps torchist==1.0.1
    .venv/bin/python tools/sidebyside/annealed_langevin/run.py --official /tmp/al_official --deps /tmp/al_deps \
        --committed /tmp/al_committed --out workflows/annealed_langevin/sidebyside.md \
        [--readme workflows/annealed_langevin/README.md]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from paperflow.annealed_langevin.claims import metrics_table  # noqa: E402
from paperflow.annealed_langevin.construct import build_target  # noqa: E402
from paperflow.annealed_langevin.evaluation import FLOOR_SEED_OFFSET, curves, final_values  # noqa: E402
from paperflow.annealed_langevin.metrics import noise_floor, panel_metrics, reference  # noqa: E402
from paperflow.annealed_langevin.paths import drift  # noqa: E402
from paperflow.annealed_langevin.sampler import (  # noqa: E402
    build_grid,
    run_em,
    sample_path,
    snapshot_iterations,  # noqa: E402
    snapshots_frame,
)
from paperflow.core.claims import fmt, judge_all, parse_claims  # noqa: E402
from paperflow.core.config import load_paper_config  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

OFFICIAL_NAMES = {
    "ula": "ULA",
    "diffusion": "diffusion",
    "tempering": "tempering",
    "dilation": "dilation",
    "daz": "DAZ",
}
SCRIPT = "experiment_gmm_1D.py"
OURS, SCORE_OFF, NOISE_OFF, OFFICIAL = "ours", "ours, score official", "ours, official drifts + noise", "official"
IMPLS = (OURS, SCORE_OFF, NOISE_OFF, OFFICIAL)


def settings(paper_paths: list[str]) -> dict[str, dict]:
    """name -> (N, T, t_max, paths, check_every of ours): the smoke config's 1-D run, and the official script's
    own sizes (the paper config) on `paper_paths`."""
    out = {}
    for scale, paths in (("smoke", None), ("paper", paper_paths)):
        cfg = load_paper_config("annealed_langevin", scale)
        t = cfg["targets"]["gmm1d"]
        name = f"{scale} (N = {t['n_particles']}, T = 1, t_max = {t['t_max']:g})"
        out[name] = {
            "cfg": cfg,
            "n": t["n_particles"],
            "T": 1.0,
            "t_max": float(t["t_max"]),
            "paths": paths or [p for p in t["paths"] if p != "daz"],
            "check_every": t["check_every"],
        }
    return out


class Clock:
    """Wall and CPU (user + sys of this process) seconds of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, self._cpu() - self.cpu

    @staticmethod
    def _cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime


class TorchNoise:
    """A stand-in for the numpy generator run_em draws from: the official loop's noise, th.randn_like(x) on the
    float32 (N, 1) particles after torch.manual_seed(seed), cast to float64."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)

    def standard_normal(self, shape) -> np.ndarray:
        return torch.randn(tuple(shape), dtype=torch.float32).numpy().astype(np.float64)


# ---------------------------------------------------------------------------------------------------- official
def load_official(checkout: Path, deps: Path | None):
    if deps is not None:
        sys.path.insert(0, str(deps))
    importlib.import_module("torchist")
    for name in ("deepinv", "torchvision", "torchvision.transforms", "torchvision.transforms.v2"):
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = types.ModuleType(name)
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
    sys.modules["torchvision.transforms"].v2 = sys.modules["torchvision.transforms.v2"]
    sys.path.insert(0, str(checkout))
    algo = importlib.import_module("src.algorithms")
    utils = importlib.import_module("src.utils")
    return algo, utils, (checkout / SCRIPT).read_text()


def substitute(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise SystemExit(f"{SCRIPT}: expected exactly one {old!r}; the checkout is not the commit this driver reads")
    return source.replace(old, new)


def patched_script(source: str, *, n: int, T: float, t_max: float, path: str) -> str:
    source = substitute(source, "N = 5000   # number of samples\n", f"N = {n}   # number of samples\n")
    source = substitute(source, "tmax=150\n", f"tmax={t_max!r}\n")
    source = substitute(source, "for T in [.1, 1., 2.,10.]:", f"for T in [{T!r}]:")
    source = substitute(source, "sample = gmm.sample(N_gt,tau=0.0)\n", "sample = GT_SAMPLE\n")
    head, rest = source.split("methods = {", 1)
    body, tail = rest.split("}", 1)
    switches = re.sub(r"'(\w+)':\s*True", lambda m: f"'{m[1]}': {m[1] == OFFICIAL_NAMES[path]}", body)
    if f"'{OFFICIAL_NAMES[path]}': True" not in switches:
        raise SystemExit(f"{SCRIPT}: no methods switch for {OFFICIAL_NAMES[path]!r}")
    return f"{head}methods = {{{switches}}}{tail}"


def run_official(algo, utils, source: str, setting: dict, path: str, seed: int, gt: np.ndarray) -> dict:
    import torchist

    base = algo.GeneralAnnealing
    kept: dict = {}

    class Recording(base):
        def forward(self, x_init, callback_fn=lambda cfg, state: None):
            def keep(alg, state):
                kept["x"], kept["steps"], kept["t"] = state.x_out, state.n + 1, float(state.t)
                callback_fn(alg, state)

            torch.manual_seed(seed)
            return super().forward(x_init, keep)

    code = patched_script(source, n=setting["n"], T=setting["T"], t_max=setting["t_max"], path=path)
    ns = {"__name__": "official_experiment", "GT_SAMPLE": torch.tensor(gt, dtype=torch.float32)}
    cwd = os.getcwd()
    algo.GeneralAnnealing = Recording
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            os.chdir(tmp)
            with Clock() as clock:
                exec(compile(code, SCRIPT, "exec"), ns)  # noqa: S102 (the official script, see the docstring)
    finally:
        os.chdir(cwd)
        algo.GeneralAnnealing = base
    x = kept["x"]
    bins, gt_hist = ns["direct_sample_bins"], ns["gt_hist"]
    counts = torchist.histogramdd(x, edges=bins)
    return {
        "x": x.double().numpy(),
        "steps": kept["steps"],
        "t_end": kept["t"],
        "official_kl": float(utils.KL(counts, gt_hist, bins)),
        "official_tv": float(utils.TV(counts, gt_hist, bins)),
        "wall": clock.wall,
        "cpu": clock.cpu,
    }


# --------------------------------------------------------------------------------------------------------- ours
def run_ours(gmm, gt, setting: dict, path: str, seed: int, impl: str) -> dict:
    cfg = setting["cfg"]
    variant = dict(cfg["drift"])
    if impl != OURS:
        variant["score"] = "official"
        if path == "tempering":
            variant["tempering"] = "official"
    target = cfg["targets"]["gmm1d"]
    spec = {k: target[k] for k in ("metric", "bins", "marginals")}
    zero: list[tuple[float, float]] = []  # (t, fraction of particles whose drift is exactly 0), official score

    def watched(b, times):
        step = iter(times)

        def out(x, tau):
            value = b(x, tau)
            zero.append((next(step), float(np.mean(np.all(value == 0, axis=1)))))
            return value

        return out

    with Clock() as clock:
        grid = build_grid(path, gmm, setting["T"], cfg["tau0"], setting["t_max"], target["maxit"], cfg["grid"])
        b = drift(path, gmm, **variant, prox_iters=None)
        if impl == NOISE_OFF:
            b = watched(b, grid["t"].to_numpy())
        if impl == NOISE_OFF:
            times, taus = grid["t"].to_numpy(), grid["tau"].to_numpy()
            start = np.full((setting["n"], 1), float(target["x0"]))
            at = snapshot_iterations(len(times) - 1, setting["check_every"])
            snaps = snapshots_frame(run_em(start, times, taus, b, TorchNoise(seed), at), times, seed)
        else:
            snaps = sample_path(
                gmm,
                grid,
                b,
                x0=target["x0"],
                n_particles=setting["n"],
                seeds=[seed],
                check_every=setting["check_every"],
                progress=False,
            )
        final = final_values(curves(snaps, gmm, gt, spec)).iloc[0]
    last = snaps[snaps.it == snaps.it.max()][["x0"]].to_numpy()
    t_half = next((t for t, frac in zero if frac < 0.5), float("nan")) if zero else float("nan")
    return {
        "kl": final.kl,
        "tv": final.tv,
        "steps": int(final.iterations),
        "t_end": final.t,
        "wall": clock.wall,
        "cpu": clock.cpu,
        "variant": variant,
        **mode_masses(last),
        "t_drift_half": t_half,
        "zero_drift_first": zero[0][1] if zero else float("nan"),
    }


BASINS = (-1.0, 1.0)  # the three modes' basins: x < -1, -1 <= x < 1, x >= 1


def mode_masses(x: np.ndarray) -> dict[str, float]:
    """Fractions of the particles in the three basins (the target's mode weights are about 0.3, 0.4, 0.3)."""
    left, mid = float(np.mean(x[:, 0] < BASINS[0])), float(np.mean(x[:, 0] < BASINS[1]))
    return {"mass_left": left, "mass_mid": mid - left, "mass_right": 1.0 - mid}


# ---------------------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", type=Path, required=True, help="checkout of habring/time-inhom-Langevin")
    parser.add_argument("--deps", type=Path, default=None, help="folder with torchist (pip install --target)")
    parser.add_argument("--committed", type=Path, default=None, help="folder with T_1.0/KL_comparison.csv")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--paper-paths", nargs="+", default=["dilation"], help="paths at the official sizes")
    parser.add_argument("--skip-paper", action="store_true", help="only the smoke-size setting")
    parser.add_argument("--smoke-paths", nargs="+", default=None, help="paths at the smoke sizes (default: config)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path, default=None, help="README to put the table in")
    parser.add_argument("--render-only", action="store_true", help="re-render --out from the CSV beside it")
    args = parser.parse_args()
    if args.render_only:
        write(pd.read_csv(args.out.with_suffix(".csv")), args)
        return
    torch.set_num_threads(1)
    algo, utils, source = load_official(args.official, args.deps)
    rows = []
    for name, setting in settings(args.paper_paths).items():
        if args.skip_paper and name.startswith("paper"):
            continue
        cfg = setting["cfg"]
        if args.smoke_paths is not None and name.startswith("smoke"):
            setting["paths"] = args.smoke_paths
        gmm = build_target({k: cfg["targets"]["gmm1d"][k] for k in ("means", "stds", "weights", "random")})
        gt = gmm.sample(cfg["n_gt"], np.random.default_rng(cfg["gt_seed"]))  # as write_target draws it
        ref = reference("density_1d", gmm, gt, list(cfg["targets"]["gmm1d"]["bins"]), None)
        for path in setting["paths"]:
            for seed in args.seeds:
                floor = noise_floor(gmm, ref, setting["n"], np.random.default_rng(FLOOR_SEED_OFFSET + seed))[0]
                for impl in IMPLS:
                    if impl == OFFICIAL:
                        r = run_official(algo, utils, source, setting, path, seed, gt)
                        x = r.pop("x")
                        r["kl"], r["tv"] = panel_metrics(x, ref)[0]
                        r.update(mode_masses(x), t_drift_half=float("nan"), zero_drift_first=float("nan"))
                        r["variant"] = "official script"
                    else:
                        r = run_ours(gmm, gt, setting, path, seed, impl)
                    rows.append(
                        {
                            "setting": name,
                            "path": path,
                            "seed": seed,
                            "impl": impl,
                            "n": setting["n"],
                            "t_max": setting["t_max"],
                            "floor_kl": floor[0],
                            "floor_tv": floor[1],
                            **{k: v for k, v in r.items() if k != "variant"},
                            "variant": str(r["variant"]),
                        }
                    )
                    print({k: v for k, v in rows[-1].items() if k != "variant"}, flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(args.out.with_suffix(".csv"), index=False)
    write(table, args)


def target_masses() -> list[float]:
    """The target's mass in the three basins (exact, from the mixture's normal CDFs)."""
    from scipy.stats import norm

    t = load_paper_config("annealed_langevin", "smoke")["targets"]["gmm1d"]
    means, stds, w = (np.asarray(t[k], dtype=float).ravel() for k in ("means", "stds", "weights"))
    cdf = [float(w @ norm.cdf(b, means, stds)) for b in BASINS]
    return [cdf[0], cdf[1] - cdf[0], 1.0 - cdf[1]]


def committed_values(folder: Path) -> dict[str, float]:
    """The last logged value of every column of the committed T = 1 KL_comparison.csv (N = 5000, t_max = 150)."""
    frame = pd.read_csv(folder / "T_1.0" / "KL_comparison.csv")
    return {c: float(frame[c].dropna().iloc[-1]) for c in frame.columns if c != "iter"}


def official_commit(path: Path) -> str:
    return (path / "COMMIT").read_text().strip() if (path / "COMMIT").exists() else "unknown"


def write(table: pd.DataFrame, args: argparse.Namespace) -> None:
    committed = committed_values(args.committed) if args.committed is not None else None
    args.out.write_text(render(table, official_commit(args.official), committed))
    if args.readme is not None:
        splice(args.readme, "sidebyside", args.out.read_text())
    print(args.out.read_text())


def mean_sd(values: pd.Series) -> str:
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}" if len(values) > 1 else f"{values.mean():.4f}"


def gated_claims(table: pd.DataFrame, setting: str, impl: str, seeds: list[int]) -> list:
    """The config's claims gated at smoke scale, judged by paperflow.core.claims on one implementation's runs
    (a control whose path this table lacks is left out)."""
    sub = table[(table.setting == setting) & (table.impl == impl)]
    finals = {
        ("gmm1d", path, "1"): g.sort_values("seed").assign(iterations=g.steps, t=g.t_end)[
            ["seed", "kl", "tv", "floor_kl", "floor_tv", "iterations", "t"]
        ]
        for path, g in sub.groupby("path")
    }
    paths = set(sub.path.unique())
    specs = [
        s if s.control_method in paths else replace(s, control=None)
        for s in parse_claims(
            load_paper_config("annealed_langevin", "smoke")["claims"], "config/annealed_langevin.yaml"
        )
        if s.gated_at("smoke")
    ]
    return judge_all(specs, metrics_table(finals, "gmm1d", "smoke"), "smoke")


def render(table: pd.DataFrame, commit: str, committed: dict | None) -> str:
    seeds = sorted(table.seed.unique())
    lines = [
        f"Official code: github.com/habring/time-inhom-Langevin at {commit} ({SCRIPT} + src/, run by "
        f"tools/sidebyside/annealed_langevin/run.py with N, tmax, T, the path switch and the ground-truth sample "
        f"substituted; torch {torch.__version__}, one thread). KL/TV: final iterate, our histogram metric "
        "(200 bins over the range of the same 5000 ground-truth samples) for every row; floor = the same KL "
        "for N exact samples.",
        "",
        "| setting | path | impl | " + " | ".join(f"KL s{s}" for s in seeds) + " | KL mean ± sd | TV mean | floor KL"
        " | steps | wall s/run | CPU s/run |",
        "|---|---|---|" + "---|" * len(seeds) + "---|---|---|---|---|---|",
    ]
    for (setting, path, impl), g in table.groupby(["setting", "path", "impl"], sort=False):
        g = g.sort_values("seed")
        lines.append(
            f"| {setting} | {path} | {impl} | " + " | ".join(f"{v:.4f}" for v in g.kl) + f" | {mean_sd(g.kl)} |"
            f" {g.tv.mean():.4f} | {g.floor_kl.mean():.4f} | {int(g.steps.max())} | {g.wall.mean():.1f} |"
            f" {g.cpu.mean():.1f} |"
        )
    lines += [
        "",
        "Where the particles end (mean over seeds of the fraction in each mode's basin, x < -1, -1 <= x < 1, x >= 1;"
        " the target has " + ", ".join(f"{m:.3f}" for m in target_masses()) + "), and for the runs with the official"
        " score fed the official noise: the fraction of particles whose drift is exactly 0 at the first step, and"
        " the time t after which it is 0 for fewer than half of them:",
        "",
        "| setting | path | impl | left | middle | right | drift = 0 at step 1 | t until drift = 0 for < half |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (setting, path, impl), g in table.groupby(["setting", "path", "impl"], sort=False):
        zero = f"{g.zero_drift_first.mean():.3f} | {g.t_drift_half.mean():.4f}" if impl == NOISE_OFF else "- | -"
        lines.append(
            f"| {setting} | {path} | {impl} | {g.mass_left.mean():.3f} | {g.mass_mid.mean():.3f} |"
            f" {g.mass_right.mean():.3f} | {zero} |"
        )
    official = table[table.impl == OFFICIAL]
    gap = (official.kl - official.official_kl).abs().max()
    lines += [
        "",
        f"The official runs' KL by its own code (util.KL on a torchist histogram, float32) differs from our metric "
        f"on the same particles by at most {gap:.1e}.",
    ]
    if committed is not None:
        lines.append(
            "Committed official results (results/gmm_1d/T_1.0/KL_comparison.csv at 9197abc, N = 5000, t_max = 150, "
            "last logged value, a mean of 5 checks): " + ", ".join(f"{k} {v:.4f}" for k, v in committed.items()) + "."
        )
    lines += [
        "",
        "Seconds per run (mean over seeds; ratio = official / ours, 'ours' the pipeline's drifts):",
        "",
        "| setting | path | ours wall | ours CPU | official wall | official CPU | ratio wall | ratio CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (setting, path), g in table.groupby(["setting", "path"], sort=False):
        o, t = g[g.impl == OURS], g[g.impl == OFFICIAL]
        lines.append(
            f"| {setting} | {path} | {o.wall.mean():.1f} | {o.cpu.mean():.1f} | {t.wall.mean():.1f} |"
            f" {t.cpu.mean():.1f} | {t.wall.mean() / o.wall.mean():.2f} | {t.cpu.mean() / o.cpu.mean():.2f} |"
        )
    for setting in table.setting.unique():
        present = set(table[table.setting == setting].path)
        if not {"ula", "diffusion", "tempering"} <= present:
            continue
        per_impl = {impl: gated_claims(table, setting, impl, seeds) for impl in IMPLS}
        lines += [
            "",
            f"Gated claims (spec §7) on the runs of `{setting}`, judged by the pipeline's own checker"
            " (paperflow.core.claims: estimate [95 % interval], verdict):",
            "",
            "| claim | " + " | ".join(IMPLS) + " |",
            "|---|" + "---|" * len(IMPLS),
        ]
        for i, claim in enumerate(per_impl[OURS]):
            cells = [
                f"{fmt(c.value)} [{fmt(c.ci_low)}, {fmt(c.ci_high)}], {c.verdict}"
                for c in (per_impl[impl][i] for impl in IMPLS)
            ]
            lines.append(f"| {claim.id} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
