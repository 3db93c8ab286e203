"""Lightning glue: seeding reproduces a fit, CSV logs always, wandb offline stays on disk."""

from __future__ import annotations

import os

import numpy as np
import torch

from paperflow.core.training import make_trainer, tracking_ids
from paperflow.ph_vae.checkpoint import load_vae
from paperflow.ph_vae.training import fit

MODEL = {
    "latent_dim": 2,
    "encoder_hidden": [8],
    "decoder_hidden": [8],
    "n_phases": 3,
    "beta": 1.0,
    "likelihood": "expm",
}
TRAIN = {"epochs": 2, "batch_size": 64, "lr": 1e-2, "weight_decay": 0.0, "grad_clip": 1.0, "devices": 1}


def data():
    return np.random.default_rng(0).pareto(2.2, size=(256, 1)) + 1.0


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        history, _ = fit(
            data(),
            decoder="ph",
            seed=seed,
            model=MODEL,
            train=TRAIN,
            run_dir=tmp_path / name,
            checkpoint=tmp_path / f"{name}.ckpt",
        )
        runs[name] = (history, load_vae(tmp_path / f"{name}.ckpt"))
    wa, wb, wc = (torch.cat([p.flatten() for p in runs[k][1].parameters()]) for k in "abc")
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert list(runs["a"][0].epoch) == [0, 1] and np.isfinite(runs["a"][0].loss).all()
    assert (tmp_path / "a" / "csv" / "ph-seed3" / "metrics.csv").is_file()


def test_wandb_offline_writes_under_the_run_dir_and_reports_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = make_trainer(
        max_epochs=1,
        run_dir=tmp_path,
        name="t",
        wandb={"enabled": True, "mode": "offline", "project": "pf-test"},
        tags={"paper": "p", "rule": "r"},
    )
    ids = tracking_ids(trainer)
    assert ids["wandb"]["offline"] is True and ids["wandb"]["id"]
    assert str(tmp_path) in ids["wandb"]["dir"]
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert offline, os.listdir(tmp_path)
    import wandb

    wandb.finish()


def test_ddp_on_two_cpu_processes_matches_one_process(tmp_path):
    """DDP (gloo, 2 spawned workers, half the batch each) optimises like one process on the full batch."""
    x = np.random.default_rng(1).pareto(2.2, size=(512, 1)) + 1.0
    train = TRAIN | {"epochs": 3, "batch_size": 128}
    results = {}
    for devices in (1, 2):
        history, _ = fit(
            x,
            decoder="ph",
            seed=5,
            model=MODEL,
            train=train | {"devices": devices},
            run_dir=tmp_path / f"d{devices}",
            checkpoint=tmp_path / f"d{devices}.ckpt",
        )
        vae = load_vae(tmp_path / f"d{devices}.ckpt")
        torch.manual_seed(0)
        with torch.no_grad():
            results[devices] = (history, vae.loss(torch.as_tensor(x, dtype=torch.float32)).item())
    (_, loss1), (h2, loss2) = results[1], results[2]
    assert list(h2.epoch) == [0, 1, 2] and np.isfinite(h2.loss).all()
    assert h2.loss.iloc[-1] < h2.loss.iloc[0]  # the DDP run trained
    print(f"single-process loss {loss1:.5f}, 2-process DDP loss {loss2:.5f}")
    assert abs(loss2 - loss1) / abs(loss1) < 0.05, (loss1, loss2)
    assert not np.isclose(loss2, load_untrained_loss(x))


def load_untrained_loss(x: np.ndarray) -> float:
    from paperflow.ph_vae.checkpoint import build_vae

    torch.manual_seed(0)
    vae = build_vae(1, "ph", MODEL)
    with torch.no_grad():
        return vae.loss(torch.as_tensor(x, dtype=torch.float32)).item()


def test_spawned_ddp_workers_destroy_their_process_group_at_teardown(tmp_path):
    """A worker's teardown leaves no process group behind (its backend threads joined before the worker exits)."""
    import torch.distributed as dist
    from lightning_fabric.plugins.environments import LightningEnvironment
    from pytorch_lightning.accelerators import CPUAccelerator

    from paperflow.core.training import SpawnDDPStrategy

    def strategy():
        return SpawnDDPStrategy(
            accelerator=CPUAccelerator(), start_method="spawn", cluster_environment=LightningEnvironment()
        )

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    strategy().teardown()
    assert not dist.is_initialized()
    strategy().teardown()  # no group left: a no-op
