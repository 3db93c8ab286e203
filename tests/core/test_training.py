"""Lightning glue: seeding reproduces a fit, CSV logs always, wandb offline stays on disk."""

from __future__ import annotations

import os

import numpy as np
import pytest
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


def _dropout_fit(seed: int):
    """A dropout MLP regression (the step draws from the global torch stream), Adam with an exponential schedule."""
    from paperflow.core.training import seed_everything

    seed_everything(seed)
    x, y = torch.randn(64, 5), torch.randn(64, 1)
    net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)

    def step(epoch: int):
        loss = torch.nn.functional.mse_loss(net(x), y)
        return loss, {"loss": loss.detach(), "epoch_seen": float(epoch)}

    return net, opt, scheduler, step


def test_step_module_takes_the_plain_loops_steps_bit_for_bit(tmp_path):
    """core.training.fit_steps (the Lightning engine of safer and spaef) against core.loop.run_loop: the same
    weights and losses after 6 steps with dropout and a scheduler; another seed gives other weights."""
    from paperflow.core.loop import run_loop
    from paperflow.core.training import StepModule, epoch_history, fit_steps

    net, opt, scheduler, step = _dropout_fit(0)
    rows = run_loop(step, opt, 6, scheduler=scheduler, progress=False)
    plain = {k: v.clone() for k, v in net.state_dict().items()}

    net, opt, scheduler, step = _dropout_fit(0)
    module = StepModule(step, [net], {"optimizer": opt, "lr_scheduler": scheduler})
    trainer = fit_steps(module, 6, run_dir=tmp_path, name="fit")
    for key, value in net.state_dict().items():
        assert torch.equal(value, plain[key]), key
    history = epoch_history(trainer)
    assert history["epoch_seen"].tolist() == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(history["loss"], [r["loss"] for r in rows], rtol=1e-6)
    assert scheduler.get_last_lr()[0] == pytest.approx(1e-2 * 0.9**6, rel=1e-12)  # the scheduler stepped each epoch

    other, opt, scheduler, step = _dropout_fit(1)
    StepModule(step, [other], opt)  # an unfitted module: the seed alone changes the weights
    run_loop(step, opt, 6, progress=False)
    assert not torch.equal(other[0].weight, net[0].weight)


def test_make_fabric_keeps_or_sets_the_precision_and_finish_names_the_logs(tmp_path):
    from paperflow.core.training import finish_fabric, make_fabric, make_loggers

    fabric = make_fabric(make_loggers(tmp_path, "run", None, {}))
    model = fabric.setup_module(torch.nn.Linear(3, 1).double())
    assert model.module.weight.dtype == torch.float64 and fabric.device.type == "cpu"  # "32-true" converts nothing
    fabric.log_dict({"loss": 1.5}, step=0)
    ids = finish_fabric(fabric)
    assert ids["engine"] == "lightning" and ids["device"] == "cpu"
    assert (tmp_path / "csv" / "run" / "metrics.csv").read_text().splitlines()[1].startswith("1.5")
    fabric64 = make_fabric(precision="64-true")
    assert fabric64.setup_module(torch.nn.Linear(3, 1)).module.weight.dtype == torch.float64


class _Records:
    """What a step keeps outside its modules (as safer's loss list): saved in and restored from checkpoints."""

    def __init__(self):
        self.losses: list[float] = []

    def state_dict(self):
        return {"losses": list(self.losses)}

    def load_state_dict(self, state):
        self.losses = list(state["losses"])


def _resumable_fit(seed: int, folder, run_dir, fail_at: int | None = None):
    from paperflow.core.training import StepModule, fit_steps

    net, opt, scheduler, step = _dropout_fit(seed)
    records, calls = _Records(), []

    def recorded(epoch: int):
        if epoch == fail_at:
            raise RuntimeError("killed")  # the job dies in this epoch
        calls.append(epoch)
        loss, logs = step(epoch)
        records.losses.append(float(loss))
        return loss, logs

    module = StepModule(recorded, [net], {"optimizer": opt, "lr_scheduler": scheduler}, state=records)
    trainer = fit_steps(module, 6, checkpoint_dir=folder, checkpoint_every_s=0.0, run_dir=run_dir, name="fit")
    return net, records, calls, trainer


def test_step_fit_killed_mid_run_resumes_to_the_uninterrupted_fit_and_a_finished_one_is_not_refitted(tmp_path):
    """fit_steps with a checkpoint folder (the Lightning engine of safer's and spaef's paper-scale fits): a fit that
    dies in epoch 3, rerun from a fresh start, ends with the weights, the step's own records and the CSV history of
    an uninterrupted fit; a finished fit, rerun, runs no step and has them all too (a job of several fits)."""
    from paperflow.core.training import epoch_history

    clean, records, calls, trainer = _resumable_fit(0, tmp_path / "clean", tmp_path / "run_clean")
    assert calls == list(range(6))
    history = epoch_history(trainer)

    with pytest.raises(RuntimeError, match="killed"):
        _resumable_fit(0, tmp_path / "ckpt", tmp_path / "run", fail_at=3)
    resumed, records2, calls2, trainer2 = _resumable_fit(0, tmp_path / "ckpt", tmp_path / "run")
    assert calls2 == [3, 4, 5]  # epochs 0-2 came from the checkpoint
    for key, value in resumed.state_dict().items():
        assert torch.equal(value, clean.state_dict()[key]), key
    assert records2.losses == records.losses
    assert epoch_history(trainer2).equals(history)

    again, records3, calls3, trainer3 = _resumable_fit(1, tmp_path / "ckpt", tmp_path / "run")  # other init
    assert calls3 == [] and records3.losses == records.losses
    for key, value in again.state_dict().items():
        assert torch.equal(value, clean.state_dict()[key]), key
    assert epoch_history(trainer3).equals(history)
