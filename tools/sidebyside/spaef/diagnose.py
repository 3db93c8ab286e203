"""Issue 31 diagnosis: train the SpaEF denoiser on one smoke instance as the pipeline does (same task,
optimizer, seed) and probe it every `--every` epochs in eval mode (no dropout, so the probes draw no
random numbers and leave the training trajectory as it is): training loss, the spread of mu across spots
within a gene (mean over genes of the std over spots; the input's is given in the header), pi, theta,
the gate, and the gene-wise PCC to the clean signal of eval-mode mu; at the end, the pipeline's output
(mu of the training forward at the lowest training loss) and its PCC.

Variants: the model before issue 31 (legacy.py: torch default init of the linear layers and gate, ELU and
dropout on the latent, torch's xavier on the attention vectors), each fix switched on in turn, and the
current model, at the spec's smoke lr 1e-3 and at the config's lr.

    .venv/bin/python tools/sidebyside/spaef/diagnose.py --root results/smoke/spaef --seed 0 \
        --out workflows/spaef/diagnosis.md [--readme workflows/spaef/README.md]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import torch

from paperflow.core.config import load_paper_config
from paperflow.core.io import read_frame
from paperflow.core.seeding import seed_all
from paperflow.spaef.metrics import genewise_pcc
from paperflow.spaef.stages import dense, graph_edges
from paperflow.spaef.training import DenoiserTask

sys.path.insert(0, str(Path(__file__).parent))
from legacy import legacy_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

# name -> (legacy switches or None for the current model, lr or None for the config's, epochs)
VARIANTS = {
    "before issue 31": ({"init": True, "latent": True, "att": True}, 1e-3, 300),
    "before issue 31, 1500 epochs": ({"init": True, "latent": True, "att": True}, 1e-3, 1500),
    "code's init of linear layers and gate": ({"init": False, "latent": True, "att": True}, 1e-3, 300),
    "+ linear latent": ({"init": False, "latent": False, "att": True}, 1e-3, 300),
    "+ PyG's attention init (now)": (None, 1e-3, 300),
    "now, config lr": (None, None, 300),
}
TRAJECTORIES = ("before issue 31, 1500 epochs", "now, config lr")


def train(x, clean, spot, gene, model_cfg, train_cfg, seed, every):
    seed_all(seed)
    task = DenoiserTask(x, spot, gene, model_cfg, train_cfg, "learned")
    opt, scheduler = task.optimizer()
    task.train()
    probes = []
    start = time.perf_counter()
    for epoch in range(int(train_cfg["epochs"])):
        opt.zero_grad(set_to_none=True)
        loss, _ = task.step_loss(epoch)
        loss.backward()
        opt.step()
        scheduler.step()
        if epoch % every == 0 or epoch == train_cfg["epochs"] - 1:
            task.eval()
            with torch.no_grad():
                out = task.net(task.x, task.spot_edges, task.gene_edges)
            task.train()
            mu = out["mu"].numpy()
            probes.append(
                {
                    "epoch": epoch,
                    "loss": loss.item(),
                    "mu_spot_sd": float(mu.std(0).mean()),
                    "pi_mean": float(out["pi"].mean()),
                    "theta_mean": float(out["theta"].mean()),
                    "w_mean": float(out["w"].mean()),
                    "pcc_eval_mu": genewise_pcc(mu, clean),
                }
            )
    seconds = time.perf_counter() - start
    summary = {
        "best_loss": task.best_loss,
        "best_epoch": task.best_epoch,
        "pcc_output": genewise_pcc(task.best_mu, clean),
        "output_spot_sd": float(task.best_mu.std(0).mean()),
        "pcc_eval_mu_last": probes[-1]["pcc_eval_mu"],
        "w_mean": float(np.mean(task.best_w)),
        "seconds": seconds,
    }
    return summary, pd.DataFrame(probes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_paper_config("spaef", "smoke")
    sample = f"{cfg['claim_dataset']}_s{args.seed}"
    adata = ad.read_h5ad(args.root / "data" / sample / "proc.h5ad")
    x, clean = dense(adata.X), dense(adata.layers["clean"])
    graphs, _ = read_frame(args.root / "graphs" / sample / f"seed{args.seed}.parquet")
    spot, gene = graph_edges(graphs, "spot_lm"), graph_edges(graphs, "gene_lm")
    rows, trajectories = [], {}
    for name, (switches, lr, epochs) in VARIANTS.items():
        train_cfg = dict(cfg["train"], epochs=epochs, engine="loop")
        if lr is not None:
            train_cfg["lr"] = lr
        patch = legacy_model(**switches) if switches is not None else contextlib.nullcontext()
        with patch:
            summary, probes = train(x, clean, spot, gene, cfg["model"], train_cfg, args.seed, args.every)
        rows.append({"variant": name, "lr": train_cfg["lr"], "epochs": epochs, **summary})
        trajectories[name] = probes
        print(rows[-1], flush=True)
    lines = [
        f"Smoke instance {sample}, training seed {args.seed}, LM graphs of the smoke run, smoke model sizes, one"
        f" torch thread. Input: gene-wise PCC of raw log1p-CPM to the clean signal {genewise_pcc(x, clean):.3f};"
        f" spread of x across spots (mean over genes of the std) {x.std(0).mean():.3f}.",
        "Output = mu of the training forward at the lowest training loss (what the pipeline writes);"
        " eval mu = mu with dropout off at the last epoch.",
        "",
        "| variant | lr | epochs | best loss (epoch) | output PCC | output μ spot sd | eval-μ PCC | gate mean | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['lr']:g} | {r['epochs']} | {r['best_loss']:.4f} ({r['best_epoch']}) |"
            f" {r['pcc_output']:.3f} | {r['output_spot_sd']:.3f} | {r['pcc_eval_mu_last']:.3f} | {r['w_mean']:.3f} |"
            f" {r['seconds']:.1f} |"
        )
    for name in TRAJECTORIES:
        lines += [
            "",
            f"Trajectory, {name} (eval-mode probes):",
            "",
            "| epoch | loss | μ spot sd | π mean | θ mean | gate mean | eval-μ PCC |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in trajectories[name].itertuples():
            lines.append(
                f"| {p.epoch} | {p.loss:.4f} | {p.mu_spot_sd:.3f} | {p.pi_mean:.3f} | {p.theta_mean:.1f} |"
                f" {p.w_mean:.3f} | {p.pcc_eval_mu:.3f} |"
            )
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    if args.readme is not None:
        splice(args.readme, "diagnosis", text)
    print(text)


if __name__ == "__main__":
    main()
