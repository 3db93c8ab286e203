"""Side by side: our SpaEF denoiser (paperflow.spaef) and the official code (github.com/Zekuan-Shang/SpaEF,
main.py + model.py, run unmodified from a checkout) on the same inputs: the same log1p-CPM matrix, the
same LM spot graph and gene graph (read from a results folder of the workflow), the same model sizes,
learning rate and epochs. Nothing of the official code is copied here: its `main.WorkFlow` and `model`
are imported from the checkout given with --official (its Loki imports, which only the graph-building
steps use, are stubbed; the graphs are handed to it as the `cell_graph_index.pt` / `gene_graph_index.pt`
files it loads when they exist).

Per run it records the lowest training loss and its epoch, the last loss, the output's gene-wise PCC to
the clean signal and GMM domain ARI, the output's spread across spots within a gene (mean over genes of
the std of mu), the gate's mean at the output epoch, and the seconds of the fit (for the official code
also the part spent writing its best_output_<epoch>.csv files, which it does at every improvement).

Usage (from the repository root, after a smoke run; the checkout is a work tree of the official repo):

    git --git-dir=<bare repo> archive <commit> | tar -x -C /tmp/spaef_official; echo <commit> > /tmp/spaef_official/COMMIT
    .venv/bin/python tools/sidebyside/spaef/run.py --official /tmp/spaef_official \
        --root results/smoke/spaef --seeds 0 1 2 --out workflows/spaef/sidebyside.md [--readme workflows/spaef/README.md]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import torch

from paperflow.core.config import load_paper_config
from paperflow.core.io import read_frame
from paperflow.spaef.metrics import domain_scores, genewise_pcc
from paperflow.spaef.stages import dense, graph_edges
from paperflow.spaef.training import fit_denoiser

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

# (name, model sizes, lr, epochs); None = the value of config/spaef.yaml at smoke scale. Both codes run with the
# current model (ours after the issue-31 fix); the first setting is the smoke lr before the fix.
SETTINGS = {
    "spec smoke lr 1e-3 (the setting before issue 31)": {
        "hidden": [64, 32],
        "latent": 16,
        "heads": 2,
        "lr": 1e-3,
        "epochs": 300,
    },
    "smoke config (now)": {"hidden": None, "latent": None, "heads": None, "lr": None, "epochs": None},
    "code defaults (paper sizes, lr 1e-4, 800 ep)": {
        "hidden": [256, 128],
        "latent": 64,
        "heads": 4,
        "lr": 1e-4,
        "epochs": 800,
    },
}


RENAMED = {"spec smoke (lr 1e-3, before issue 31)": "spec smoke lr 1e-3 (the setting before issue 31)"}


def resolve(setting: dict, cfg: dict) -> dict:
    model = dict(cfg["model"])
    train = dict(cfg["train"], engine="loop")
    for key in ("hidden", "latent", "heads"):
        if setting[key] is not None:
            model[key] = setting[key]
    for key in ("lr", "epochs"):
        if setting[key] is not None:
            train[key] = setting[key]
    return {"model": model, "train": train}


def load_official(path: Path):
    """Import the checkout's main.py (and through it model.py) with its Loki imports stubbed."""
    names = ["Loki", "Loki.src", "Loki.src.loki", *(f"Loki.src.loki.{m}" for m in ("utils", "preprocess", "decompose"))]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    for parent, child in zip(names, names[1:4]):
        setattr(sys.modules[parent], child.rsplit(".", 1)[1], sys.modules[child])
    for m in ("utils", "preprocess", "decompose"):
        setattr(sys.modules["Loki.src.loki"], m, sys.modules[f"Loki.src.loki.{m}"])
    sys.path.insert(0, str(path))
    main = importlib.import_module("main")  # sets torch's thread counts to the CPU count; reset by the caller
    model = importlib.import_module("model")
    return main, model


def run_official(main, model, x: pd.DataFrame, coords: np.ndarray, spot, gene, setting: dict, seed: int) -> dict:
    m, t = setting["model"], setting["train"]
    gates: list[float] = []

    def build(cell_num: int, gene_num: int):
        net = model.DenoiseAE(cell_num, gene_num, latent_dim=m["latent"])
        heads = (m["heads"],) * 3
        net.CellGraphAE = model.feat_AutoEncoder(gene_num, tuple(m["hidden"]), m["latent"], heads, m["dropout"])
        net.GeneGraphAE = model.feat_AutoEncoder(cell_num, tuple(m["hidden"]), m["latent"], heads, m["dropout"])
        net.fusion_weight_layer.register_forward_hook(lambda mod, i, o: gates.append(torch.sigmoid(o).mean().item()))
        return net

    class Flow(main.WorkFlow):
        def work(self):
            return super().work(lr=t["lr"], gamma=t["gamma"])

    csv_seconds = [0.0]
    to_csv = pd.DataFrame.to_csv

    def timed_to_csv(self, *args, **kwargs):
        start = time.perf_counter()
        out = to_csv(self, *args, **kwargs)
        csv_seconds[0] += time.perf_counter() - start
        return out

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        x.to_csv(root / "expression.csv")
        pd.DataFrame(coords[:, :2], index=x.index, columns=["x", "y"]).to_csv(root / "coordinate.csv")
        torch.save(torch.as_tensor(spot.T.copy(), dtype=torch.long), root / "cell_graph_index.pt")
        torch.save(torch.as_tensor(gene.T.copy(), dtype=torch.long), root / "gene_graph_index.pt")
        torch.manual_seed(seed)
        np.random.seed(seed)
        main.DenoiseAE = build
        pd.DataFrame.to_csv = timed_to_csv
        log = io.StringIO()
        try:
            start = time.perf_counter()
            with contextlib.redirect_stdout(log):
                Flow(str(root), t["epochs"])
            seconds = time.perf_counter() - start
        finally:
            pd.DataFrame.to_csv = to_csv
        losses = [float(v) for v in re.findall(r"Epoch \d+/\d+, Loss: ([-\d.eE+na]+)", log.getvalue())]
        best = max(int(p.stem.rsplit("_", 1)[1]) for p in root.glob("best_output_*.csv"))
        mu = pd.read_csv(root / f"best_output_{best}.csv", index_col=0).to_numpy(np.float64)
    return {
        "mu": mu,
        "best_loss": float(np.min(losses)),
        "best_epoch": best - 1,  # the official code counts epochs from 1
        "last_loss": losses[-1],
        "w_mean": gates[best - 1],
        "seconds": seconds,
        "csv_seconds": csv_seconds[0],
    }


def run_ours(x: np.ndarray, spot, gene, setting: dict, seed: int) -> dict:
    start = time.perf_counter()
    mu, w, hist, track = fit_denoiser(
        x,
        spot,
        gene,
        model=setting["model"],
        train=setting["train"],
        fusion="learned",
        seed=seed,
        run_dir=tempfile.gettempdir(),
        name=f"sidebyside_seed{seed}",
        wandb=None,
        tags={},
    )
    return {
        "mu": mu,
        "best_loss": track["best_loss"],
        "best_epoch": track["best_epoch"],
        "last_loss": float(hist["loss"].iloc[-1]),
        "w_mean": float(np.mean(w)),
        "seconds": time.perf_counter() - start,
        "csv_seconds": 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", type=Path, required=True, help="work tree of github.com/Zekuan-Shang/SpaEF")
    parser.add_argument("--root", type=Path, required=True, help="a results folder of the workflow (smoke)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), help="names from SETTINGS")
    parser.add_argument("--seeds-slow", type=int, nargs="*", default=[0], help="seeds for the paper-size setting")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path, default=None, help="README to put the table in")
    parser.add_argument("--render-only", action="store_true", help="re-render --out from the CSV beside it")
    args = parser.parse_args()
    if args.render_only:
        table = pd.read_csv(args.out.with_suffix(".csv")).replace({"setting": RENAMED})
        commit = official_commit(args.official)
        table.to_csv(args.out.with_suffix(".csv"), index=False)
        write(table, commit, args)
        return
    cfg = load_paper_config("spaef", "smoke")
    main_mod, model_mod = load_official(args.official)
    torch.set_num_threads(1)
    commit = official_commit(args.official)
    rows = []
    for name in args.settings:
        setting = resolve(SETTINGS[name], cfg)
        seeds = args.seeds_slow if setting["model"]["hidden"][0] > 64 else args.seeds
        for seed in seeds:
            sample = f"{cfg['claim_dataset']}_s{seed}"
            adata = ad.read_h5ad(args.root / "data" / sample / "proc.h5ad")
            x, clean = dense(adata.X), dense(adata.layers["clean"])
            labels = adata.obs["domain"].to_numpy()
            graphs, _ = read_frame(args.root / "graphs" / sample / f"seed{seed}.parquet")
            spot, gene = graph_edges(graphs, "spot_lm"), graph_edges(graphs, "gene_lm")
            frame = pd.DataFrame(x, index=adata.obs_names, columns=adata.var_names)
            results = {
                "ours": run_ours(x, spot, gene, setting, seed),
                "official": run_official(main_mod, model_mod, frame, adata.obsm["spatial"], spot, gene, setting, seed),
            }
            for impl, r in results.items():
                rows.append(
                    {
                        "setting": name,
                        "impl": impl,
                        "seed": seed,
                        "lr": setting["train"]["lr"],
                        "epochs": setting["train"]["epochs"],
                        "best_loss": r["best_loss"],
                        "best_epoch": r["best_epoch"],
                        "last_loss": r["last_loss"],
                        "pcc": genewise_pcc(r["mu"], clean),
                        "ari_gmm": domain_scores(r["mu"], labels, cfg["evaluate"]["n_pcs"], seed)["ari_gmm"],
                        "mu_spot_sd": float(r["mu"].std(0).mean()),
                        "w_mean": r["w_mean"],
                        "seconds": r["seconds"],
                        "csv_seconds": r["csv_seconds"],
                        "raw_pcc": genewise_pcc(x, clean),
                        "raw_ari_gmm": domain_scores(x, labels, cfg["evaluate"]["n_pcs"], seed)["ari_gmm"],
                    }
                )
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(args.out.with_suffix(".csv"), index=False)
    write(table, commit, args)


def write(table: pd.DataFrame, commit: str, args: argparse.Namespace) -> None:
    args.out.write_text(render(table, commit))
    if args.readme is not None:
        splice(args.readme, "sidebyside", args.out.read_text())
    print(args.out.read_text())


def official_commit(path: Path) -> str:
    """The checkout's commit: a COMMIT file (a work tree made by `git archive` has no .git; write the commit
    there), else `git rev-parse HEAD` when the checkout is the top of its own git work tree."""
    if (path / "COMMIT").exists():
        return (path / "COMMIT").read_text().strip()
    try:
        git = ["git", "-C", str(path), "rev-parse"]
        top = subprocess.run([*git, "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
        if Path(top).resolve() == path.resolve():
            return subprocess.run([*git, "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    return "unknown"


def render(table: pd.DataFrame, commit: str) -> str:
    lines = [
        f"Official code: github.com/Zekuan-Shang/SpaEF at {commit} (main.py, model.py, unmodified; PyG "
        f"{importlib.import_module('torch_geometric').__version__}, torch {torch.__version__}, one CPU thread).",
        "Same inputs for both: the smoke run's log1p-CPM matrix, LM spot graph and gene graph of each seed; the output is",
        "mu of the training forward at the lowest training loss in both. Seconds: the whole fit; for the official code",
        "the part spent in its best_output_<epoch>.csv writes is given in brackets.",
        "",
        "| setting | impl | seed | best loss (epoch) | last loss | PCC to clean | ARI (GMM) | μ spot sd | gate mean | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        csv = f" ({r.csv_seconds:.1f})" if r.csv_seconds else ""
        lines.append(
            f"| {r.setting} | {r.impl} | {r.seed} | {r.best_loss:.4f} ({r.best_epoch}) | {r.last_loss:.4f} |"
            f" {r.pcc:.3f} | {r.ari_gmm:.3f} | {r.mu_spot_sd:.3f} | {r.w_mean:.3f} | {r.seconds:.1f}{csv} |"
        )
    lines += [
        "",
        "Mean over the seeds run:",
        "",
        "| setting | impl | seeds | PCC to clean | ARI (GMM) | s per run |",
        "|---|---|---|---|---|---|",
    ]
    for (setting, impl), g in table.groupby(["setting", "impl"], sort=False):
        lines.append(
            f"| {setting} | {impl} | {len(g)} | {g.pcc.mean():.3f} | {g.ari_gmm.mean():.3f} | {g.seconds.mean():.1f} |"
        )
    raw = table.drop_duplicates("seed")
    lines.append(
        f"| raw log1p-CPM (reference) | - | {len(raw)} | {raw.raw_pcc.mean():.3f} | {raw.raw_ari_gmm.mean():.3f} | - |"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
