"""The CUDA paths, on a machine with a GPU (`pytest -m gpu tests/gpu`, or `tools/gpu_check.sh`, which also times
them): each test runs a computation on CUDA and checks it against the same computation on CPU, so a device bug
(a tensor left on the CPU, a kernel without CUDA support, NCCL not set up) fails here rather than in a
paper-scale job. Without CUDA every test is skipped; CI has no GPU and skips them all.

Covered: Lightning's fit with `accelerator="auto"` on one GPU and DDP over NCCL on two (when present); spaef's
CSR attention (sparse products and the SDDMM backward) against the edge-list reference; the language-model kit
(`build_model`, `sample`, `sequence_logprobs`) on CUDA against CPU; mtbl_wc's penalty method with its CUDA
device selection; the MiniLM text encoder on CUDA against CPU (credal_dro, doubt, uka, dualreform use it)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

# PAPERFLOW_GPU_TEST_DEVICE=cpu runs the same checks with "cuda" read as "cpu": a dry run of the tests' own logic
# on a machine without a GPU (the comparisons are then trivially CPU against CPU)
DEV = os.environ.get("PAPERFLOW_GPU_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        DEV == "cuda" and not torch.cuda.is_available(), reason="needs CUDA (tools/gpu_check.sh on a GPU machine)"
    ),
]

PH_MODEL = {
    "latent_dim": 2,
    "encoder_hidden": [8],
    "decoder_hidden": [8],
    "n_phases": 3,
    "beta": 1.0,
    "likelihood": "expm",
}
PH_TRAIN = {"epochs": 3, "batch_size": 128, "lr": 1e-2, "weight_decay": 0.0, "grad_clip": 1.0, "devices": 1}


def _ph_fit(tmp_path, name, devices):
    from paperflow.ph_vae.checkpoint import load_vae
    from paperflow.ph_vae.training import fit

    x = np.random.default_rng(1).pareto(2.2, size=(512, 1)) + 1.0
    history, _ = fit(
        x,
        decoder="ph",
        seed=5,
        model=PH_MODEL,
        train=PH_TRAIN | {"devices": devices},
        run_dir=tmp_path / name,
        checkpoint=tmp_path / f"{name}.ckpt",
    )
    vae = load_vae(tmp_path / f"{name}.ckpt")
    torch.manual_seed(0)
    with torch.no_grad():
        return history, vae.loss(torch.as_tensor(x, dtype=torch.float32)).item()


def test_lightning_fit_runs_on_the_gpu(tmp_path):
    from paperflow.core.training import make_trainer

    trainer = make_trainer(max_epochs=1, run_dir=tmp_path, name="probe")
    assert trainer.accelerator.__class__.__name__ == ("CUDAAccelerator" if DEV == "cuda" else "CPUAccelerator")
    history, loss_gpu = _ph_fit(tmp_path, "gpu", 1)
    assert np.isfinite(history.loss).all() and history.loss.iloc[-1] < history.loss.iloc[0]
    assert np.isfinite(loss_gpu)


@pytest.mark.skipif(DEV == "cuda" and torch.cuda.device_count() < 2, reason="DDP over NCCL needs two GPUs")
def test_ddp_over_nccl_matches_one_gpu(tmp_path):
    (_, one), (h2, two) = _ph_fit(tmp_path, "one", 1), _ph_fit(tmp_path, "two", 2)
    assert list(h2.epoch) == [0, 1, 2] and np.isfinite(h2.loss).all()
    assert abs(two - one) / abs(one) < 0.05, (one, two)


def test_spaef_csr_attention_and_gradients_on_cuda_equal_the_edge_list_reference():
    from paperflow.spaef.model import Adjacency, GATConv, with_self_loops

    torch.manual_seed(4)
    n, dev = 300, torch.device(DEV)
    layer = GATConv(6, 4, heads=3).eval().to(dev)
    edges = with_self_loops(torch.randint(0, n, (2, 3000)), n).to(dev)
    adj = Adjacency(edges, n).to(dev)
    h = torch.randn(n, 3, 4, device=dev, requires_grad=True)
    a_s = torch.randn(n, 3, device=dev, requires_grad=True)
    a_d = torch.randn(n, 3, device=dev, requires_grad=True)
    weights = torch.randn(n, 3, 4, device=dev)
    outs, grads = [], []
    for path, graph in ((layer._edges, edges), (layer._sparse, adj)):
        out = path(h, a_s, a_d, graph)
        assert out.device.type == DEV
        outs.append(out)
        grads.append(torch.autograd.grad((out * weights).sum(), (h, a_s, a_d)))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    for mine, reference in zip(grads[1], grads[0]):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-5)


def test_lm_kit_samples_and_scores_on_cuda_like_on_cpu():
    from paperflow.core.lm.models import build_model
    from paperflow.core.lm.sampling import sample, sequence_logprobs

    spec = {
        "arch": "qwen2",
        "vocab_size": 32,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    cpu = build_model(spec, seed=0).eval()
    gpu = build_model(spec, seed=0).eval().to(DEV)
    ids = torch.randint(3, 32, (4, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        lp_cpu = sequence_logprobs(cpu, ids, mask)
        lp_gpu = sequence_logprobs(gpu, ids.to(DEV), mask.to(DEV))
    assert lp_gpu.device.type == DEV
    torch.testing.assert_close(lp_gpu.cpu(), lp_cpu, rtol=1e-4, atol=1e-4)
    out = sample(
        gpu,
        ids.to(DEV),
        mask.to(DEV),
        max_new_tokens=5,
        temperature=0.0,
        generator=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    ref = sample(cpu, ids, mask, max_new_tokens=5, temperature=0.0, generator=None, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences.cpu(), ref.sequences)  # greedy decoding: the same tokens


def test_mtbl_wc_penalty_method_on_cuda_matches_cpu():
    from paperflow.core.training import make_fabric
    from paperflow.mtbl_wc import fronts
    from paperflow.mtbl_wc.algorithm import run
    from paperflow.mtbl_wc.experiment import build_problem
    from paperflow.mtbl_wc.prepare import preference_matrix

    assert make_fabric().device.type == DEV  # the device the train jobs build their problem on (issue 54: Fabric's)
    spec = {
        "n_obj": 2,
        "dim_x": 5,
        "dim_y": 10,
        "rows": 8,
        "rank": 6,
        "sv_range": [1.0, 1.5],
        "b_scale": 0.3,
        "c_scale": 1.5,
    }
    inst = fronts.quadratic_instance(spec, 0)
    prefs = preference_matrix([0.3, 0.7])
    exact = fronts.quadratic_front(inst, prefs, 51)
    z0 = np.tile(np.random.default_rng(0).normal(size=15), (2, 1))
    solver = {
        "steps": 300,
        "rho0": 10.0,
        "rho_max": 100.0,
        "ramp": 30,
        "tau": 0.01,
        "eta0": 1.0,
        "x_step": 1.0,
        "eval_every": 100,
        "chebyshev": "smooth",
        "penalty_grad": "analytic",
        "f_ref": "ideal",
        "output": "best",
        "noise_std": 0.1,
        "decay_steps": 100,
    }
    res = {
        d: run(build_problem("quadratic", inst, d), "wc", prefs, z0, exact["ideal"], solver, 0) for d in ("cpu", DEV)
    }
    np.testing.assert_allclose(res[DEV].z_final, res["cpu"].z_final, rtol=1e-6, atol=1e-8)


def test_minilm_encoder_on_cuda_matches_cpu():
    pytest.importorskip("sentence_transformers")
    from paperflow.core.lm.encoders import encode_sentences

    texts = ["a claim about a paper", "another sentence", "the third one"]
    gpu, cpu = (encode_sentences(texts, batch_size=2, device=d) for d in (DEV, "cpu"))
    np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-4)
