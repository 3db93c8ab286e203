"""st_gfn's tensor-loop HyperGrid sampler against torchgfn's own `Sampler` on the same seed and policy:
the same trajectories (states, actions, lengths, rewards, masks) in both of its modes (policy tabulated
on every state, or evaluated on each step's rows), so swapping it in is semantically neutral; and the
losses of torchgfn's TB on both batches agree."""

from __future__ import annotations

import pytest
import torch
from gfn.gflownet import TBGFlowNet
from gfn.samplers import Sampler

from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.models import make_estimators
from paperflow.st_gfn.sampling import HyperGridSampler, make_sampler

GRID = {"kind": "hypergrid", "ndim": 2, "height": 8, "R0": 0.1, "R1": 0.5, "R2": 2.0}


def batches(sampler, env, seed: int, epsilon: float, count: int = 20, n: int = 16):
    torch.manual_seed(seed)
    return [sampler.sample_trajectories(env, n=n, epsilon=epsilon) for _ in range(count)]


@pytest.mark.parametrize("grid", [dict(GRID), dict(GRID, ndim=3)], ids=["2d", "3d"])
@pytest.mark.parametrize("time_features", [0, 4])
@pytest.mark.parametrize("epsilon", [0.0, 0.05, 1.0])
def test_same_trajectories_as_torchgfn_sampler_on_the_same_seed(grid, time_features, epsilon):
    env = make_env(grid)
    torch.manual_seed(7)
    pf, _, _ = make_estimators(env, hidden=32, layers=2, time_features=time_features)
    sampler = HyperGridSampler(env, pf)
    assert sampler.tabulate(16) == (grid["ndim"] == 2)  # 64 states: policy tabulated; 512: per-step rows
    ours = batches(sampler, env, seed=3, epsilon=epsilon)
    ref = batches(Sampler(estimator=pf), env, seed=3, epsilon=epsilon)
    for a, b in zip(ours, ref):
        assert torch.equal(a.states.tensor, b.states.tensor)
        assert torch.equal(a.actions.tensor, b.actions.tensor)
        assert torch.equal(a.terminating_idx, b.terminating_idx)
        assert torch.equal(a.states.forward_masks, b.states.forward_masks)
        assert torch.equal(a.states.backward_masks, b.states.backward_masks)
        assert torch.equal(a.log_rewards, b.log_rewards)
    lengths = torch.cat([a.terminating_idx for a in ours])
    assert lengths.min() >= 1 and lengths.unique().numel() > 3  # varied trajectories, not a degenerate policy


def test_a_different_seed_gives_different_trajectories():
    env = make_env(GRID)
    pf, _, _ = make_estimators(env, hidden=32, layers=2, time_features=0)
    sampler = HyperGridSampler(env, pf)
    a, b = batches(sampler, env, 0, 0.05, count=1)[0], batches(sampler, env, 1, 0.05, count=1)[0]
    assert not torch.equal(a.terminating_idx, b.terminating_idx) or not torch.equal(a.states.tensor, b.states.tensor)


def test_torchgfn_losses_agree_on_the_two_samplers_batches():
    env = make_env(GRID)
    torch.manual_seed(1)
    pf, pb, _ = make_estimators(env, hidden=32, layers=2, time_features=0)
    tb = TBGFlowNet(pf=pf, pb=pb, init_logZ=0.3)
    ours = batches(HyperGridSampler(env, pf), env, seed=5, epsilon=0.05, count=1)[0]
    ref = batches(Sampler(estimator=pf), env, seed=5, epsilon=0.05, count=1)[0]
    assert float(tb.loss(env, ours)) == float(tb.loss(env, ref)) > 0


def test_the_sampler_refuses_what_it_cannot_sample():
    env = make_env(GRID)
    pf, pb, _ = make_estimators(env, hidden=8, layers=1, time_features=0)
    with pytest.raises(ValueError, match="backward estimator"):
        HyperGridSampler(env, pb)
    with pytest.raises(ValueError, match="another env"):
        HyperGridSampler(env, pf).sample_trajectories(make_env(GRID), n=2)
    assert isinstance(make_sampler(env, pf), HyperGridSampler)


def test_the_runtime_benchmark_times_every_configured_run(capsys):
    from paperflow.st_gfn.bench import main

    main(["tiny"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 + 4 + 2 + 1 and lines[-1].startswith(
        "total cpu"
    )  # tiny: 3 noisy + 4 clean + 2 tic-tac-toe runs
    assert [line.split()[0] for line in lines[:-1]] == ["noisy"] * 3 + ["clean"] * 4 + ["tictactoe"] * 2
    assert all("final loss" in line for line in lines[:-1])
