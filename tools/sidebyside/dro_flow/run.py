"""Side by side: our uncertain-least-squares DRO (paperflow.dro_flow, dataset `uls_official`) and the official
script (github.com/ZusenXu/GFS-DRO, uncertain_least_squares/uncertain_least_squares.py, run unmodified from a
checkout) on the same inputs: the same A0, A1, b and 20 training xi (read from the smoke run's data files and
checked equal to the script's own draws), the same settings (every constant of the script is checked against
config/dro_flow.yaml before anything runs) and the same seeds. Nothing of the official code is copied here:
its `solve_erm`, `solve_wrm`, `solve_dual`, `solve_wgf`, `solve_wfr` and `run_experiment` are imported from the
checkout given with --official.

Per seed s and method, three runs:
- "official": `np.random.seed(s)`, then the script's `solve_<method>` on the training xi (the script itself runs
  all solvers one after another on one stream; reseeding before each makes a method's run independent of the
  order, as ours are);
- "ours": `paperflow.dro_flow.training.fit` with seed s (torch's generator: other draws than numpy's);
- "ours, official draws" (Dual, WGF, WFR): ours again, its normal and level draws taken from numpy's legacy
  stream seeded s in the order the script draws them, so the two codes see the same random numbers and what
  is left is the difference between the codes.
Every theta is scored by the same evaluator (the pipeline's: test xi = (1 + Delta) u, u the smoke test file's
1000 draws, Delta on the config grid); the script's own loss function is checked to give the same values.
The script as published (`run_experiment`: one stream, fresh test draws at every Delta) is run once more and
its own numbers are reported. The last table explains ERM's small-Delta window by the closed form of the
expected test loss, E l(theta, xi) = a + k (1 + Delta)^2 with a = ||A0 theta - b||^2 / m, k = ||A1 theta||^2 / (12 m).

Seconds: wall and CPU (user + sys, resource.getrusage) of each solver call in this process, one thread for
both (torch and BLAS), after one warm-up call of each code; process start (imports) measured apart.

Usage (from the repository root, after a run whose `run_datasets` include `uls_official`, which writes the data
files: the cpu scale, or smoke before 2026-12-07, when smoke was cut to `uls` and `circle`; the checkout holds the
official file at commit 021ebd767f02341baa5ed5b50eca224f8f514150, read with the search tools' read_file since
the repository is too large to fetch, and a COMMIT file):

    mkdir -p /tmp/dro_flow_official/uncertain_least_squares    # + uncertain_least_squares.py, verbatim
    echo 021ebd767f02341baa5ed5b50eca224f8f514150 > /tmp/dro_flow_official/COMMIT
    .venv/bin/python tools/sidebyside/dro_flow/run.py --official /tmp/dro_flow_official \
        --root results/cpu/dro_flow --scale cpu --out workflows/dro_flow/sidebyside.md --readme workflows/dro_flow/README.md
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy is imported: one BLAS thread, as torch below
os.environ.setdefault("MPLBACKEND", "Agg")  # the official script imports pyplot

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from paperflow.core.config import load_paper_config  # noqa: E402
from paperflow.core.io import read_frame  # noqa: E402
from paperflow.dro_flow import samplers  # noqa: E402
from paperflow.dro_flow.claims import LABELS  # noqa: E402
from paperflow.dro_flow.evaluation import delta_grid, shift_losses  # noqa: E402
from paperflow.dro_flow.problems import Problem, make_problem  # noqa: E402
from paperflow.dro_flow.training import fit  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

DATASET = "uls_official"
METHODS = ["erm", "wrm", "dual", "wgf", "wfr"]
RANDOM = {"dual", "wgf", "wfr"}  # the methods that draw random numbers
OFFICIAL_NAMES = {"erm": "ERM", "wrm": "WRM", "dual": "Dual", "wgf": "WGF", "wfr": "WFR"}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@contextlib.contextmanager
def timed(out: dict):
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    out["wall"], out["cpu"] = time.perf_counter() - wall, cpu_seconds() - cpu


def official_module(checkout: Path):
    sys.path.insert(0, str(checkout / "uncertain_least_squares"))
    with contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module("uncertain_least_squares")


def settings_pairs(uls, spec: dict) -> list[tuple[str, object, object]]:
    """(name, official constant, ours) for every setting the two codes share."""
    d, dro, tr, ev = spec["data"], spec["dro"], spec["train"], spec["evaluate"]
    return [
        ("dim", uls.DIM_N, d["dim"]),
        ("rows m", uls.DIM_M, d["dim"]),
        ("n_train", uls.N_TRAIN_SAMPLES, d["n_train"]),
        ("n_test", uls.N_TEST_SAMPLES, d["n_test"]),
        ("Delta max", uls.DELTA_MAX, ev["delta_max"]),
        ("Delta steps", uls.DELTA_STEPS, ev["delta_steps"]),
        ("epochs", uls.N_EPOCHS, tr["epochs"]),
        ("outer lr", uls.LEARNING_RATE, tr["lr"]),
        ("grad clip", uls.GRAD_CLIP_THRESHOLD, tr["grad_clip"]),
        ("lambda", uls.LAMBDA_VAL, dro["lam"]),
        ("epsilon", uls.EPSILON, dro["eps"]),
        ("particles M", uls.M_PARTICLES, dro["particles"]),
        ("inner steps K", uls.K_INNER_STEPS, dro["steps"]),
        ("inner step eta", uls.INNER_STEP_SIZE, dro["lr"]),
        ("WFR weight step", uls.WFR_WEIGHT_STEP_SIZE, dro["weight_lr"]),
        ("dual max level", uls.SINKHORN_SAMPLE_LEVEL, dro["dual_max_level"]),
        ("full batch", True, tr["batch_size"] == d["n_train"] and not tr["shuffle"]),
        ("optimizer", "sgd", tr["optimizer"]),
        ("clip xi to [-1, 1]", [-1.0, 1.0], list(dro["clamp"])),
        ("gradients 10x (no 1/m)", 10.0, dro["grad_scale"]),
        ("WFR birth-death", False, dro["birth_death"]),
        ("dual noise x + sqrt(eps) N", "official", dro["dual_noise"]),
    ]


def check_inputs(uls, problem: Problem, xi_official: np.ndarray) -> None:
    a0, a1, b = (np.array(problem.meta[k]) for k in ("A0", "A1", "b"))
    for name, ours, theirs in (("A0", a0, uls.A0), ("A1", a1, uls.A1), ("b", b, uls.b)):
        if not np.array_equal(ours, theirs):
            raise SystemExit(f"{name} of the data file differs from the official script's")
    if not np.array_equal(problem.x[:, 0].numpy(), xi_official):
        raise SystemExit("training xi of the data file differ from the official script's draw")


class LegacyDraws:
    """Stands in for `torch` inside paperflow.dro_flow.samplers: its normal draws and the dual's level draw
    come from numpy's legacy global stream (what the official script draws from), the rest is torch."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def randn(shape, generator=None, dtype=None) -> torch.Tensor:
        return torch.from_numpy(np.random.standard_normal(tuple(shape))).to(dtype)

    @staticmethod
    def multinomial(probs: torch.Tensor, n: int, generator=None) -> torch.Tensor:
        p = probs.double().numpy()
        return torch.tensor([np.random.choice(len(p), p=p / p.sum())])


@contextlib.contextmanager
def official_draws(seed: int):
    saved = samplers.torch
    samplers.torch = LegacyDraws()
    np.random.seed(seed)
    try:
        yield
    finally:
        samplers.torch = saved


@contextlib.contextmanager
def autograd_energy():
    """Our samplers as before issue 19: the least-squares energy differentiated by autograd."""
    saved = Problem.energy
    Problem.energy = lambda self, model, y: lambda z: self.loss(model, z, y)
    try:
        yield
    finally:
        Problem.energy = saved


def theta_of(model) -> np.ndarray:
    return model.theta.detach().numpy().copy()


def model_with(problem: Problem, theta: np.ndarray):
    model = problem.build(0)
    with torch.no_grad():
        model.theta.copy_(torch.as_tensor(theta))
    return model


def window_stats(losses: np.ndarray, deltas: np.ndarray, small, large) -> dict[str, float]:
    def mean(lo, hi):
        return float(losses[(deltas >= lo - 1e-12) & (deltas <= hi + 1e-12)].mean())

    return {"d0": float(losses[0]), "small": mean(*small), "large": mean(*large)}


def decomposition(problem: Problem, theta: np.ndarray) -> tuple[float, float]:
    """a, k of E l(theta, xi) = a + k (1 + Delta)^2 for xi ~ U[-(1 + Delta)/2, (1 + Delta)/2]."""
    a0, a1, b = (np.array(problem.meta[k]) for k in ("A0", "A1", "b"))
    m = len(b)
    return float(np.sum((a0 @ theta - b) ** 2) / m), float(np.sum((a1 @ theta) ** 2) / (12 * m))


def import_seconds(checkout: Path) -> dict[str, float]:
    """CPU seconds (user + sys) of a fresh process that only imports each code."""
    codes = {
        "ours": "import torch; import paperflow.dro_flow.training",
        "torch": "import torch",
        "torch + torch._dynamo": "import torch, torch._dynamo",
        "official": f"import sys; sys.path.insert(0, {str(checkout / 'uncertain_least_squares')!r}); "
        "import uncertain_least_squares",
    }
    out = {}
    for name, code in codes.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[name] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def fmt(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}"


def pm(values: list[float]) -> str:
    return f"{fmt(float(np.mean(values)))} ± {fmt(float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, 2)}"


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(1)
    cfg = load_paper_config("dro_flow", args.scale)
    spec = cfg["datasets"][DATASET]
    claim = cfg["claim"]
    small, large = claim["small_window"], claim["large_window"]
    uls = official_module(args.official)
    xi_official = uls.generate_training_data(uls.N_TRAIN_SAMPLES)  # the script's draw, right after A0, A1, b
    pairs = settings_pairs(uls, spec)
    mismatched = [p for p in pairs if p[1] != p[2]]
    if mismatched:
        raise SystemExit(f"settings differ (name, official, ours): {mismatched}")
    train, meta = read_frame(args.root / "data" / DATASET / "train.parquet")
    test, _ = read_frame(args.root / "data" / DATASET / "test.parquet")
    problem = make_problem(train, meta, spec["model"])
    check_inputs(uls, problem, xi_official)
    u_test = test["x0"].to_numpy()
    deltas = delta_grid(spec["evaluate"])
    commit = (args.official / "COMMIT").read_text().strip() if (args.official / "COMMIT").exists() else "unknown"

    def score(theta: np.ndarray) -> dict[str, float]:
        return window_stats(shift_losses(problem, model_with(problem, theta), u_test, deltas), deltas, small, large)

    # the official loss function on the same thetas and test xi gives the same test losses
    probe = np.linspace(-1.0, 1.0, uls.DIM_N)
    evaluator_gap = max(
        abs(float(uls.erm_objective_function(probe, (1.0 + d) * u_test)) - v)
        for d, v in zip(deltas, shift_losses(problem, model_with(problem, probe), u_test, deltas))
    )

    fit(problem, "wgf", spec["dro"], dict(spec["train"], epochs=1), 0)  # warm-up of each code
    with np.errstate(all="ignore"):
        uls.solve_wrm(xi_official)

    rows = []  # (seed, method, impl, theta, wall, cpu)
    for seed in args.seeds:
        for method in METHODS:
            t: dict = {}
            np.random.seed(seed)
            with timed(t), np.errstate(all="ignore"), contextlib.redirect_stdout(io.StringIO()):
                theta = getattr(uls, f"solve_{method}")(xi_official.copy())
            rows.append((seed, method, "official", np.asarray(theta, dtype=float), t["wall"], t["cpu"]))
            with timed(t):
                model, _ = fit(problem, method, spec["dro"], spec["train"], seed)
            rows.append((seed, method, "ours", theta_of(model), t["wall"], t["cpu"]))
            if method in RANDOM:
                with official_draws(seed), timed(t):
                    model, _ = fit(problem, method, spec["dro"], spec["train"], seed)
                rows.append((seed, method, "ours, official draws", theta_of(model), t["wall"], t["cpu"]))
            print(f"seed {seed} {method} done", file=sys.stderr)

    before = []  # (method, bit-identical theta, cpu) of the autograd path, first seed
    for method in sorted(RANDOM | {"wrm"}):
        t = {}
        with autograd_energy(), timed(t):
            model, _ = fit(problem, method, spec["dro"], spec["train"], args.seeds[0])
        now = next(th for s, m, impl, th, *_ in rows if (s, m, impl) == (args.seeds[0], method, "ours"))
        before.append((method, bool(np.array_equal(theta_of(model), now)), t["cpu"]))

    published = importlib.reload(uls)  # the script as published: fresh stream from seed 219
    t = {}
    with timed(t), np.errstate(all="ignore"), contextlib.redirect_stdout(io.StringIO()):
        pub_deltas, pub_results = published.run_experiment()
    pub_seconds = t
    starts = import_seconds(args.official)

    official_theta = {(s, m): th for s, m, impl, th, *_ in rows if impl == "official"}
    scored = {(s, m, impl): (score(th), th, w, c) for s, m, impl, th, w, c in rows}

    lines = [
        f"Official code: github.com/ZusenXu/GFS-DRO at {commit} (uncertain_least_squares/uncertain_least_squares.py, "
        f"unmodified; numpy {np.__version__}, torch {torch.__version__}, one thread each).",
        f"Same inputs: the {args.scale} run's `uls_official` data files (A0, A1, b and the 20 training xi equal to the script's "
        "own draws, checked); every setting equal (checked): "
        + ", ".join(f"{name} {ours}" for name, _, ours in pairs)
        + ".",
        f"Every theta is scored by the pipeline's evaluator (test xi = (1 + Delta) u, u the 1000 draws of the {args.scale} test "
        f"file, {len(deltas)} Delta from 0 to {deltas[-1]:g}); the script's loss function gives the same values "
        f"(max difference {evaluator_gap:.1e}). Seconds: wall / CPU (user + sys) of each call, one thread, "
        "on a 2-core machine shared with other jobs (wall inflated).",
        "",
        f"| seed | method | impl | loss at Delta = 0 | mean over [{small[0]:g}, {small[1]:g}] | "
        f"mean over [{large[0]:g}, {large[1]:g}] | ‖θ − θ_official‖ / ‖θ_official‖ | s wall / CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (seed, method, impl), (st, th, wall, cpu) in scored.items():
        ref = official_theta[(seed, method)]
        rel = float(np.linalg.norm(th - ref) / np.linalg.norm(ref))
        lines.append(
            f"| {seed} | {LABELS[method]} | {impl} | {fmt(st['d0'])} | {fmt(st['small'])} | {fmt(st['large'])} | "
            f"{rel:.1e} | {wall:.2f} / {cpu:.2f} |"
        )

    lines += [
        "",
        f"Mean ± std over seeds {', '.join(map(str, args.seeds))}; CPU seconds per run and the ratio ours / official:",
        "",
        f"| method | impl | loss at Delta = 0 | mean over [{small[0]:g}, {small[1]:g}] | "
        f"mean over [{large[0]:g}, {large[1]:g}] | max rel. θ diff to official | CPU s per run | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    per_impl_cpu: dict[str, list[float]] = {}
    for method in METHODS:
        for impl in ("official", "ours", "ours, official draws"):
            keys = [(s, method, impl) for s in args.seeds if (s, method, impl) in scored]
            if not keys:
                continue
            st = [scored[k][0] for k in keys]
            rel = max(
                float(np.linalg.norm(scored[k][1] - official_theta[k[:2]]) / np.linalg.norm(official_theta[k[:2]]))
                for k in keys
            )
            cpu = float(np.mean([scored[k][3] for k in keys]))
            off_cpu = float(np.mean([scored[(s, method, "official")][3] for s in args.seeds]))
            if impl != "ours, official draws":
                per_impl_cpu.setdefault(impl, []).append(cpu)
            lines.append(
                f"| {LABELS[method]} | {impl} | {pm([x['d0'] for x in st])} | {pm([x['small'] for x in st])} | "
                f"{pm([x['large'] for x in st])} | {rel:.1e} | {cpu:.3f} | {cpu / off_cpu:.2f} |"
            )
    ours_seed, off_seed = sum(per_impl_cpu["ours"]), sum(per_impl_cpu["official"])
    lines += [
        "",
        f"Per seed (the five methods): CPU {ours_seed:.2f} s ours, {off_seed:.2f} s official (ratio "
        f"{ours_seed / off_seed:.2f}). Process start (imports only, CPU): ours {starts['ours']:.2f} s (torch), "
        f"official {starts['official']:.2f} s (numpy, scipy, matplotlib); torch.optim's first use imports "
        f"torch._dynamo, {starts['torch + torch._dynamo'] - starts['torch']:.2f} s more, which our ULS training "
        "(plain SGD) no longer pays.",
        "",
        f"Before issue 19 our samplers differentiated the least-squares loss by autograd at every inner step; now "
        f"it has a closed-form z-gradient in the same float operations. Seed {args.seeds[0]}, CPU s per run:",
        "",
        "| method | autograd (before) | closed form (now) | official | θ bit-identical |",
        "|---|---|---|---|---|",
        *(
            f"| {LABELS[m]} | {cpu:.3f} | {scored[(args.seeds[0], m, 'ours')][3]:.3f} | "
            f"{scored[(args.seeds[0], m, 'official')][3]:.3f} | {'yes' if same else 'NO'} |"
            for m, same, cpu in before
        ),
        "",
        "The script as published (`run_experiment`: one stream after seed 219, all solvers in a row, fresh test "
        f"draws at every Delta; {pub_seconds['wall']:.1f} s wall / {pub_seconds['cpu']:.1f} s CPU), its own numbers:",
        "",
        f"| method | loss at Delta = 0 | mean over [{small[0]:g}, {small[1]:g}] | mean over [{large[0]:g}, {large[1]:g}] |",
        "|---|---|---|---|",
    ]
    pub_d = np.asarray(pub_deltas)
    pub = {name: window_stats(np.asarray(v), pub_d, small, large) for name, v in pub_results.items()}
    for name, st in pub.items():
        lines.append(f"| {name} | {fmt(st['d0'])} | {fmt(st['small'])} | {fmt(st['large'])} |")
    erm_small = pub["ERM"]["small"]
    beaten = [n for n, st in pub.items() if n != "ERM" and st["small"] < erm_small]
    lines += [
        "",
        f"In the published run ERM's mean over [{small[0]:g}, {small[1]:g}] ({fmt(erm_small)}) is "
        + (f"above that of {', '.join(beaten)}." if beaten else "below every other method's."),
    ]

    # why: expected test loss a + k (1 + Delta)^2, and the training draw's moments
    grid = deltas[(deltas >= small[0] - 1e-12) & (deltas <= small[1] + 1e-12)]
    threshold = float(np.mean((1.0 + grid) ** 2))
    uls_train, uls_meta = read_frame(args.root / "data" / "uls" / "train.parquet")
    uls_problem = make_problem(uls_train, uls_meta, cfg["datasets"]["uls"]["model"])
    draws = {
        f"{DATASET} (the script's draw)": (problem, spec),
        "uls (our gated set: seeded default_rng)": (uls_problem, cfg["datasets"]["uls"]),
    }
    lines += [
        "",
        "Why ERM loses the small-Delta window here: for xi ~ U[-(1 + Delta)/2, (1 + Delta)/2] the expected test loss is "
        "a + k (1 + Delta)^2 with a = ‖c‖² / m, k = ‖u‖² / (12 m), c = A0 θ − b, u = A1 θ. ERM minimises the training "
        "mean (‖c‖² + 2 mean(xi) c·u + mean(xi²) ‖u‖²) / m, so a training draw with mean(xi²) below 1/12 weights ‖u‖² "
        f"too little. A method overtakes ERM at (1 + Δ*)² = (a − a_ERM) / (k_ERM − k); the grid of [{small[0]:g}, "
        f"{small[1]:g}] has mean (1 + Δ)² = {threshold:.3f}, so ERM loses that window's mean when Δ* < "
        f"{np.sqrt(threshold) - 1:.3f} (up to the test draw's sampling error). Seed {args.seeds[0]}; ours with the "
        "training seed, uls with its own (corrected-gradient) config:",
        "",
        "| training draw | mean(xi) | mean(xi²) (population 1/12 = 0.0833) | method | impl | a | k | Δ* vs ERM |",
        "|---|---|---|---|---|---|---|---|",
    ]
    seed = args.seeds[0]
    for label, (prob, dspec) in draws.items():
        xi = prob.x[:, 0].numpy()
        thetas = {}
        for method in ("erm", "wrm", "dual", "wgf", "wfr"):
            dro = {} if method == "erm" else dspec["dro"]
            thetas[(method, "ours")] = theta_of(fit(prob, method, dro, dspec["train"], seed)[0])
            if prob is problem:
                thetas[(method, "official")] = official_theta[(seed, method)]
        a_erm, k_erm = decomposition(prob, thetas[("erm", "ours")])
        for (method, impl), th in thetas.items():
            a, k = decomposition(prob, th)
            cross = "-" if method == "erm" else _crossing(a, k, a_erm, k_erm)
            lines.append(
                f"| {label} | {xi.mean():.3f} | {np.mean(xi**2):.4f} | {LABELS[method]} | {impl} | {a:.4f} | "
                f"{k:.4f} | {cross} |"
            )
    return "\n".join(lines) + "\n"


def _crossing(a: float, k: float, a_erm: float, k_erm: float) -> str:
    if k >= k_erm:
        return "never"
    ratio = (a - a_erm) / (k_erm - k)
    return f"{max(np.sqrt(max(ratio, 0.0)) - 1.0, 0.0):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, required=True, help="checkout of ZusenXu/GFS-DRO")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("results/cpu/dro_flow"),
        help="a run's results that include uls_official (smoke runs only uls and circle)",
    )
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path)
    args = parser.parse_args()
    text = run(args)
    args.out.write_text(text)
    if args.readme:
        splice(args.readme, "sidebyside", text)


if __name__ == "__main__":
    main()
