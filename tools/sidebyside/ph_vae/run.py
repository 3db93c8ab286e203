"""Side by side: our PH-VAE (paperflow.ph_vae, Lightning) and the official code (github.com/HakimZiani/ph-vae,
models/ph_vae/{ph_vae.py, ph_vae_losses.py, ph_vae_trainer.py} and utils/ph.py, run unmodified from a checkout)
on the same inputs: the train/test files of our smoke run, the same sizes (latent, hidden layers, phases),
epochs, batch size, learning rate, weight decay, gradient clipping and seeds. Nothing of the official code is
copied here: `models.MultiDimPHVAE`, `models.train_phvae`, `models.elbo_phvae_multidim` and
`utils.ph_sample_multidim` are imported from the checkout given with --official.

Two initialisations per seed:
- "own init": each code builds its model after `torch.manual_seed(seed)` (ours through Lightning's
  `seed_everything`); the two draw their initial weights in another order, so the runs differ by seed noise.
- "shared init": the official model starts from our initial weights (copied layer by layer) with the same
  global RNG state, the same minibatch order (a DataLoader with a generator seeded by the seed, as ours) and
  therefore the same reparameterisation noise: what is left is the difference between the two codes.
The official trainer's learning-rate schedule (on by default) is off in both (`reduce_lr=False`), as in our
config; its other settings are passed explicitly.

Per run: the last epoch's training loss, the test negative ELBO per dimension and test KL (one z sample,
torch seed 10_000 + seed, each code's own ELBO), the tail metrics of 20,000 prior samples (each code's own
sampler: our exact series-form sampler, the official CTMC simulation `ph_sample_multidim`), all scored by the
same metric code (paperflow.ph_vae.metrics), and the CPU and wall seconds of the training call. For our runs
it also scores our trained weights with the official ELBO (copied into `MultiDimPHVAE`): the gap checks the
two likelihoods on the same weights (spec section 10, check 6).

Usage (from the repository root, after a smoke run, which writes the data files; the checkout is a work tree
of the official repository at commit 41497ab208760a4e9f4a0416fac871b4334476fc with a COMMIT file):

    .venv/bin/python tools/sidebyside/ph_vae/run.py --official /tmp/ph_vae_official \
        --root results/smoke/ph_vae --out workflows/ph_vae/sidebyside.md --readme workflows/ph_vae/README.md
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from paperflow.core.config import load_paper_config
from paperflow.core.io import read_array, read_frame
from paperflow.ph_vae.checkpoint import build_vae, load_vae
from paperflow.ph_vae.evaluation import SAMPLE_SEED_OFFSET, model_metrics, prior_samples, test_terms
from paperflow.ph_vae.model import VAE
from paperflow.ph_vae.training import fit

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

INITS = ("own init", "shared init")


def load_official(path: Path):
    """The checkout's `models` and `utils` packages."""
    sys.path.insert(0, str(path))
    return importlib.import_module("models"), importlib.import_module("utils")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def official_model(models, input_dim: int, cfg: dict):
    return models.MultiDimPHVAE(
        input_dim=input_dim,
        latent_dim=cfg["latent_dim"],
        n_phases=cfg["n_phases"],
        hidden_enc=tuple(cfg["encoder_hidden"]),
        hidden_dec=tuple(cfg["decoder_hidden"]),
    )


@torch.no_grad()
def copy_weights(ours: VAE, theirs) -> None:
    """Our layers into the official ones: same MLPs; our PH heads emit all D x m logits in one layer, row
    j * m + i for phase i of dimension j, the official code one layer per dimension."""
    theirs.encoder.load_state_dict(ours.encoder.state_dict())
    theirs.fc_mu.load_state_dict(ours.enc_mu.state_dict())
    theirs.fc_logvar.load_state_dict(ours.enc_logvar.state_dict())
    theirs.decoder.load_state_dict(ours.decoder.state_dict())
    m = ours.head.n_phases
    for j in range(ours.head.out_dim):
        rows = slice(j * m, (j + 1) * m)
        for mine, official in (
            (ours.head.alpha_logits, theirs.alpha_heads[j]),
            (ours.head.rate_raw, theirs.lambda_heads[j]),
        ):
            official.weight.copy_(mine.weight[rows])
            official.bias.copy_(mine.bias[rows])


@torch.no_grad()
def official_terms(models, model, x_test: np.ndarray, seed: int) -> dict[str, float]:
    """The official ELBO on the test set: negative ELBO per dimension and mean KL (one z sample)."""
    torch.manual_seed(SAMPLE_SEED_OFFSET + seed)
    loss, _, kl = models.elbo_phvae_multidim(model.eval(), torch.as_tensor(x_test, dtype=torch.float32))
    return {"test_nelbo_per_dim": loss.item() / x_test.shape[1], "test_kl": kl.item()}


@torch.no_grad()
def official_samples(utils, model, n: int, seed: int) -> np.ndarray:
    """z ~ N(0, I), then the official exact CTMC simulation per dimension."""
    torch.manual_seed(SAMPLE_SEED_OFFSET + seed)
    z = torch.randn(n, model.latent_dim)
    return utils.ph_sample_multidim(*model.decode_params(z)).double().numpy()


class SeededBatches:
    """The minibatches of our data module (a DataLoader whose generator is seeded by the seed), drawn only when
    iterated. The official trainer wraps its loader in `tqdm.auto.tqdm`, whose asyncio variant calls `iter()` once
    more per epoch without reading from it; on a DataLoader that extra iterator advances the generator, so the
    official loop would see other minibatches than ours from the same seeded loader."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        yield from self.loader


def run_official(models, x: np.ndarray, cfg: dict, seed: int, init: str) -> tuple[object, dict]:
    model_cfg, train = cfg["model"], cfg["train"]
    if init == "shared init":
        model = official_model(models, x.shape[1], model_cfg)
        torch.manual_seed(seed)  # what fit() does before it builds our module: same weights, same RNG state after
        copy_weights(build_vae(x.shape[1], "ph", model_cfg), model)
    else:
        torch.manual_seed(seed)
        model = official_model(models, x.shape[1], model_cfg)
    loader = DataLoader(
        TensorDataset(torch.tensor(x, dtype=torch.float32)),
        batch_size=train["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    log = io.StringIO()
    wall, cpu = time.perf_counter(), cpu_seconds()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(io.StringIO()):  # its progress bars
        models.train_phvae(
            model,
            SeededBatches(loader),
            epochs=train["epochs"],
            learning_rate=train["lr"],
            beta=model_cfg["beta"],
            grad_clip=train["grad_clip"],
            device="cpu",
            reduce_lr=False,
        )
    timing = {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu}
    losses = [float(v) for v in re.findall(r"Loss: ([-\d.eE+na]+)", log.getvalue())]
    return model, timing | {"last_loss": losses[-1]}


def plain_loop_cpu(x: np.ndarray, cfg: dict, seed: int) -> dict[str, float]:
    """Our model trained by the official trainer's plain loop (zero_grad, loss, backward, clip, Adam step) on our
    minibatches, without Lightning: its CPU seconds, and its last-epoch weights' distance to the Lightning run."""
    torch.manual_seed(seed)
    vae = build_vae(x.shape[1], "ph", cfg["model"])
    train = cfg["train"]
    optimizer = torch.optim.Adam(vae.parameters(), lr=train["lr"], weight_decay=train["weight_decay"])
    loader = DataLoader(
        TensorDataset(torch.tensor(x, dtype=torch.float32)),
        batch_size=train["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    cpu = cpu_seconds()
    for _ in range(train["epochs"]):
        for (batch,) in loader:
            optimizer.zero_grad(set_to_none=True)
            vae.loss(batch).backward()
            torch.nn.utils.clip_grad_norm_(vae.parameters(), train["grad_clip"])
            optimizer.step()
    return {"plain_loop_cpu_s": cpu_seconds() - cpu, "plain_loop_model": vae}


def run_ours(x: np.ndarray, cfg: dict, seed: int, tmp: Path) -> tuple[VAE, dict]:
    ckpt = tmp / f"seed{seed}.ckpt"
    wall, cpu = time.perf_counter(), cpu_seconds()
    history, _ = fit(x, decoder="ph", seed=seed, model=cfg["model"], train=cfg["train"], run_dir=tmp, checkpoint=ckpt)
    timing = {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu}
    return load_vae(ckpt), timing | {"last_loss": float(history["loss"].iloc[-1])}


def scores(samples: np.ndarray, x_test: np.ndarray, x_all: np.ndarray, truth: dict, cfg: dict) -> dict[str, float]:
    rows = model_metrics(samples, x_test, x_all, truth, cfg["evaluate"]["tail_q"], cfg["evaluate"]["min_tail"])
    ks = f"ks_tail@{cfg['evaluate']['tail_q']:g}"
    out = {f"{m}_dim{r['dim']}": r["value"] for r in rows for m in (ks, "q99_rel") if r["metric"] == m}
    out["coexc_err"] = next((r["value"] for r in rows if r["metric"] == "coexc_abs_err@0.95"), np.nan)
    return {k.replace(ks, "ks_tail"): v for k, v in out.items()}


def compare(args: argparse.Namespace) -> pd.DataFrame:
    cfg = load_paper_config("ph_vae", "smoke")
    models, utils = load_official(args.official)
    torch.set_num_threads(1)
    n = cfg["evaluate"]["n_samples"]
    rows = []
    for dataset in args.datasets:
        x, _ = read_array(args.root / "data" / dataset / "train.parquet")
        x_test, meta = read_array(args.root / "data" / dataset / "test.parquet")
        x_all = np.vstack([x, x_test])
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                vae, timing = run_ours(x, cfg, seed, Path(tmp))
            check = official_model(models, x.shape[1], cfg["model"])
            copy_weights(vae, check)
            ours_draws, their_draws = prior_samples(vae, n, seed), official_samples(utils, check, n, seed)
            their_sampler = scores(their_draws, x_test, x_all, meta["truth"], cfg)
            plain = plain_loop_cpu(x, cfg, seed)
            ours = {
                **timing,
                **test_terms(vae, x_test, seed),
                **scores(ours_draws, x_test, x_all, meta["truth"], cfg),
                "elbo_gap_same_weights": official_terms(models, check, x_test, seed)["test_nelbo_per_dim"]
                - test_terms(vae, x_test, seed)["test_nelbo_per_dim"],
                "ks_tail_dim0_official_sampler": their_sampler["ks_tail_dim0"],
                "q99_rel_dim0_official_sampler": their_sampler["q99_rel_dim0"],
                "samplers_ks2_pvalue": float(stats.ks_2samp(ours_draws[:, 0], their_draws[:, 0]).pvalue),
                "plain_loop_cpu_s": plain["plain_loop_cpu_s"],
                "plain_loop_max_weight_gap": max(
                    (a - b).abs().max().item()
                    for a, b in zip(plain["plain_loop_model"].parameters(), vae.parameters(), strict=True)
                ),
            }
            rows.append({"dataset": dataset, "seed": seed, "impl": "ours", "init": "-", **ours})
            print(rows[-1], flush=True)
            for init in args.inits:
                model, timing = run_official(models, x, cfg, seed, init)
                theirs = {
                    **timing,
                    **official_terms(models, model, x_test, seed),
                    **scores(official_samples(utils, model, n, seed), x_test, x_all, meta["truth"], cfg),
                }
                rows.append({"dataset": dataset, "seed": seed, "impl": "official", "init": init, **theirs})
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def gaussian_reference(root: Path, dataset: str, seeds: list[int]) -> dict[str, float]:
    """Our Gaussian VAE's mean tail metrics (dim 0) from the smoke run: the gated claim's threshold."""
    metrics, _ = read_frame(root / "eval" / dataset / "metrics.parquet")
    part = metrics[(metrics.decoder == "gauss") & (metrics.dim == 0) & metrics.seed.isin(seeds)]
    means = part.groupby("metric")["value"].mean()
    return {"ks_tail": float(means["ks_tail@0.95"]), "q99_rel": float(means["q99_rel"])}


def official_commit(path: Path) -> str:
    return (path / "COMMIT").read_text().strip() if (path / "COMMIT").exists() else "unknown"


def fmt(value: float, digits: int = 4) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.{digits}g}"


def render(table: pd.DataFrame, commit: str, gauss: dict[str, dict[str, float]], cfg: dict) -> str:
    m, t = cfg["model"], cfg["train"]
    lines = [
        f"Official code: github.com/HakimZiani/ph-vae at {commit} (models/ph_vae/*.py, utils/ph.py, unmodified;"
        f" torch {torch.__version__}, one CPU thread). Settings of both (our smoke config): latent {m['latent_dim']},"
        f" encoder {m['encoder_hidden']}, decoder {m['decoder_hidden']}, {m['n_phases']} phases, {t['epochs']} epochs,"
        f" batch {t['batch_size']}, Adam lr {t['lr']:g}, weight decay {t['weight_decay']:g}, clip {t['grad_clip']:g},"
        f" no LR schedule, matrix-exp likelihood; {cfg['evaluate']['n_samples']:,} prior samples; the smoke run's"
        " train/test files. Seconds: the training call, wall and CPU (user + sys) on a 2-core machine shared"
        " with other jobs (inflated, compare the ratio).",
        "",
        "| dataset | seed | code (init) | last train loss | test −ELBO/dim | test KL | KS_tail@0.95 | Q99 rel. err."
        " | co-exc. err. | train s wall / CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        code = "ours" if r.impl == "ours" else f"official ({r.init})"
        lines.append(
            f"| {r.dataset} | {r.seed} | {code} | {r.last_loss:.4f} | {r.test_nelbo_per_dim:.4f} | {r.test_kl:.3f} |"
            f" {fmt(r.ks_tail_dim0)} | {fmt(r.q99_rel_dim0)} | {fmt(r.coexc_err)}"
            f" | {r.wall_s:.1f} / {r.cpu_s:.1f} |"
        )
    lines += [
        "",
        "Mean ± std over seeds (dim 0 for the tail metrics; the gated claim compares PH with our Gaussian VAE on"
        " pareto1d, whose smoke-run means are given as the threshold):",
        "",
        "| dataset | code (init) | test −ELBO/dim | KS_tail@0.95 | Q99 rel. err. | Gaussian KS / Q99 (threshold)"
        " | train s wall | train s CPU | CPU ratio official/ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (dataset, impl, init), g in table.groupby(["dataset", "impl", "init"], sort=False):
        ours_cpu = table[(table.dataset == dataset) & (table.impl == "ours")].cpu_s.mean()
        ref = gauss.get(dataset)
        threshold = f"{ref['ks_tail']:.4g} / {ref['q99_rel']:.4g}" if ref else "-"
        code = "ours" if impl == "ours" else f"official ({init})"
        ms = {
            c: f"{g[c].mean():.4g} ± {g[c].std(ddof=1):.2g}"
            for c in ("test_nelbo_per_dim", "ks_tail_dim0", "q99_rel_dim0")
        }
        lines.append(
            f"| {dataset} | {code} | {ms['test_nelbo_per_dim']} | {ms['ks_tail_dim0']} | {ms['q99_rel_dim0']} |"
            f" {threshold} | {g.wall_s.mean():.1f} | {g.cpu_s.mean():.1f} | {g.cpu_s.mean() / ours_cpu:.2f} |"
        )
    ours = table[table.impl == "ours"]
    lines += [
        "",
        f"Same weights, both ELBOs: our trained models scored by the official `elbo_phvae_multidim` differ from our"
        f" test −ELBO/dim by at most {ours.elbo_gap_same_weights.abs().max():.2e} nats (over {len(ours)} models,"
        " same z noise).",
        "",
        "Our trained models, sampled by each code's sampler (same weights, 20,000 prior draws each, sampler seeds"
        " differ), and our model trained without Lightning by the official trainer's plain loop (same batches,"
        " same noise):",
        "",
        "| dataset | seed | KS_tail@0.95 our / official sampler | Q99 rel. err. our / official sampler"
        " | two-sample KS p (dim 0) | train CPU s Lightning / plain loop | max weight gap Lightning vs plain loop |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ours.itertuples():
        lines.append(
            f"| {r.dataset} | {r.seed} | {fmt(r.ks_tail_dim0)} / {fmt(r.ks_tail_dim0_official_sampler)} |"
            f" {fmt(r.q99_rel_dim0)} / {fmt(r.q99_rel_dim0_official_sampler)} | {r.samplers_ks2_pvalue:.3f} |"
            f" {r.cpu_s:.1f} / {r.plain_loop_cpu_s:.1f} | {r.plain_loop_max_weight_gap:.1e} |"
        )
    rejected = int((ours.samplers_ks2_pvalue < 0.05).sum())
    lines += [
        "",
        f"Two-sample KS between the samplers' draws of the same model: p < 0.05 in {rejected} of {len(ours)} models"
        f" (chance alone expects {0.05 * len(ours):.2g}). Training CPU seconds, mean over all runs: ours"
        f" (Lightning) {ours.cpu_s.mean():.2f}, ours in the plain loop {ours.plain_loop_cpu_s.mean():.2f},"
        f" official {table[table.impl == 'official'].cpu_s.mean():.2f}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", type=Path, required=True, help="work tree of github.com/HakimZiani/ph-vae")
    parser.add_argument("--root", type=Path, required=True, help="results/smoke/ph_vae of a smoke run")
    parser.add_argument("--datasets", nargs="+", default=["pareto1d", "weibull1d", "tcopula2d"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--inits", nargs="+", default=list(INITS), choices=INITS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path, default=None, help="README to put the table in")
    parser.add_argument("--render-only", action="store_true", help="re-render --out from the CSV beside it")
    args = parser.parse_args()
    csv = args.out.with_suffix(".csv")
    table = pd.read_csv(csv) if args.render_only else compare(args)
    table.to_csv(csv, index=False)
    cfg = load_paper_config("ph_vae", "smoke")
    gauss = {"pareto1d": gaussian_reference(args.root, "pareto1d", args.seeds)} if "pareto1d" in args.datasets else {}
    args.out.write_text(render(table, official_commit(args.official), gauss, cfg))
    if args.readme is not None:
        splice(args.readme, "sidebyside", args.out.read_text())
    print(args.out.read_text())


if __name__ == "__main__":
    main()
