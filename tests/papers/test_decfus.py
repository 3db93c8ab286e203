"""decfus acceptance checks (spec §10): the threshold closed form, the non-doubly-stochastic
aggregation, the exchange reductions, the stability detector, cosine similarity and topology, the
batched clients against torch's own optimiser, the claims' negative controls, data and config."""

from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from paperflow.core.claims import CONTROL_HOLDS, HELD, INCONCLUSIVE, NO_DATA, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.decfus.claims import limitations, metrics_table
from paperflow.decfus.clients import BatchedMLP, ModuleClients, batch_plan, local_round, stack_states
from paperflow.decfus.data import dirichlet_partition, iid_partition, read_cifar_binary, read_svhn_mat
from paperflow.decfus.fusion import (
    constant_fusion,
    cosine_matrix,
    decfus_fusion,
    fused_keys,
    least_similar_neighbours,
    round_fusion,
)
from paperflow.decfus.nets import VGG16BN, GroupedResNet50, mlp
from paperflow.decfus.prepare import acquire
from paperflow.decfus.schedule import DetectorSteps, StabilityDetector, client_threshold, sigmoid, threshold_at
from paperflow.decfus.topology import (
    adjacency,
    check_topology,
    diameter,
    metropolis_mixing,
    paper_topology,
    sample_weighted_mixing,
    uniform_mixing,
)

NB = paper_topology()
M = len(NB)


@pytest.fixture
def one_thread():
    """As a pipeline job with threads: 1 (tiny tensors: more threads only add contention)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SCHEDULE = dict(theta0=0.75, theta1=0.25, steepness=20.0, midpoint=0.4)


def random_states(seed: int = 0, shapes=((5, 4), (5,), (3, 5), (3,), (2, 3), (2,))) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"t{k}": torch.randn((M, *s), generator=g, dtype=torch.float64) for k, s in enumerate(shapes)}


# §10.1 threshold closed form
@pytest.mark.parametrize(
    "p, expected", [(0.4, 0.5), (0.0, 0.75 - 0.5 * sigmoid(-8.0)), (1.0, 0.75 - 0.5 * sigmoid(12.0))]
)
def test_threshold_closed_form(p, expected):
    assert threshold_at(p, **SCHEDULE) == pytest.approx(expected, abs=1e-12)


def test_threshold_values_named_in_the_spec():
    assert threshold_at(0.0, **SCHEDULE) == pytest.approx(0.74983, abs=5e-6)
    assert threshold_at(1.0, **SCHEDULE) == pytest.approx(0.250003, abs=5e-7)
    assert (
        0.25 <= threshold_at(1.5, **SCHEDULE) < threshold_at(1.0, **SCHEDULE)
    )  # p is not clipped: θ keeps falling to θ1


# §10.2 aggregation matrix
def test_sample_weighted_rows_sum_to_one_but_columns_do_not():
    n = np.arange(10, 110, 10)
    w = sample_weighted_mixing(NB, n)
    assert np.allclose(w.sum(1), 1.0)
    assert not np.allclose(w.sum(0), 1.0)
    assert np.array_equal(w > 0, adjacency(NB) + np.eye(M, dtype=int) > 0)
    assert np.allclose(sample_weighted_mixing(NB, np.full(M, 7)), uniform_mixing(NB))  # equal n: DFLAvg's weights


def test_theta_zero_with_equal_counts_averages_all_but_the_least_similar_tensor():
    states = random_states(1)
    rng = np.random.default_rng(0)
    fusion = decfus_fusion(states, NB, [50] * M, [0.0] * M, p_exchange=0.4, rng=rng)
    fused = fusion.apply(states)
    uniform = constant_fusion(states, uniform_mixing(NB)).apply(states)
    s_min, _ = least_similar_neighbours(states, fusion.keys, NB)
    for i in range(M):
        lowest = int(np.argmin(s_min[i]))
        assert fusion.averaged[i].sum() == len(fusion.keys) - 1 and not fusion.averaged[i, lowest]
        for l, key in enumerate(fusion.keys):
            if l != lowest:
                assert torch.allclose(fused[key][i], uniform[key][i])


# §10.3 exchange reductions
def test_theta_one_and_certain_exchange_copies_the_least_similar_neighbour():
    states = random_states(2)
    fusion = decfus_fusion(states, NB, list(range(1, M + 1)), [1.0] * M, p_exchange=1.0, rng=np.random.default_rng(0))
    _, j_star = least_similar_neighbours(states, fusion.keys, NB)
    fused = fusion.apply(states)
    assert not fusion.averaged.any()
    for i in range(M):
        for l, key in enumerate(fusion.keys):
            assert torch.equal(fused[key][i], states[key][j_star[i, l]])


def test_identical_clients_make_fusion_the_identity():
    one = random_states(3)
    states = {k: v[:1].repeat(M, *([1] * (v.dim() - 1))) for k, v in one.items()}
    for thetas in ([0.75] * M, [0.25] * M, [1.0] * M):
        fused = decfus_fusion(states, NB, list(range(5, 5 + M)), thetas, 0.4, np.random.default_rng(1)).apply(states)
        for key in states:
            assert torch.allclose(fused[key], states[key], rtol=0, atol=1e-12)


def test_fusion_reads_only_the_pre_fusion_snapshot():
    states = random_states(4)
    before = {k: v.clone() for k, v in states.items()}
    fusion = decfus_fusion(states, NB, list(range(3, 3 + M)), [0.5] * M, 0.4, np.random.default_rng(2))
    fused = fusion.apply(states)
    for key in states:
        assert torch.equal(states[key], before[key])  # the snapshot is untouched
        l = fusion.keys.index(key)
        manual = torch.stack([sum(fusion.mixing[l, i, j] * before[key][j] for j in range(M)) for i in range(M)])
        assert torch.allclose(fused[key], manual)


def test_about_a_fraction_theta_of_tensors_is_exchanged():
    states = random_states(5, shapes=[(4, 3)] * 8)  # 8 tensors, as the smoke MLP
    for theta, averaged in ((0.75, 2), (0.25, 6)):
        fusion = decfus_fusion(states, NB, [1] * M, [theta] * M, 0.4, np.random.default_rng(3))
        assert (fusion.averaged.sum(1) == averaged).all()


def test_baseline_fusions():
    states = random_states(6)
    n = list(range(1, M + 1))
    rng = np.random.default_rng(4)
    mr = round_fusion("dflmr", states, NB, n, [0.75] * M, 0.4, rng)
    assert np.allclose(mr.mixing.sum(2), 1.0) and set(np.unique(mr.mixing)) == {0.0, 1.0}
    assert (mr.mixing * (1 - (adjacency(NB) + np.eye(M)))[None] == 0).all()  # copies only from {i} ∪ N(i)
    fed = round_fusion("fedavg", states, NB, n, [0.75] * M, 0.4, rng).apply(states)
    for key in states:
        mean = (torch.tensor(n, dtype=torch.float64).view(-1, *[1] * (states[key].dim() - 1)) * states[key]).sum(
            0
        ) / sum(n)
        assert torch.allclose(fed[key], mean.expand_as(fed[key]))
    assert round_fusion("dpsgd", states, NB, n, [0.75] * M, 0.4, rng) is None
    w = metropolis_mixing(NB)
    assert np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1) and np.allclose(w, w.T)
    with pytest.raises(ValueError, match="unknown method"):
        round_fusion("dfedsam", states, NB, n, [0.75] * M, 0.4, rng)


def test_batchnorm_counter_is_not_fused():
    states = {"bn.weight": torch.randn(M, 3), "bn.num_batches_tracked": torch.arange(M)}
    assert fused_keys(states) == ["bn.weight"]
    fused = round_fusion("dflavg", states, NB, [1] * M, [0.75] * M, 0.4, np.random.default_rng(0)).apply(states)
    assert torch.equal(fused["bn.num_batches_tracked"], torch.arange(M))


# §10.4 stability detector
STEPS = DetectorSteps.from_ratios(rounds=100, test_round=1, protection=0.2, ref_start=0.1, ref_end=0.2)


def feed(values) -> StabilityDetector:
    det = StabilityDetector(window=5, ratio=0.3, steps=STEPS)
    for u, v in enumerate(values):
        det.update(v, u)
    return det


def test_detector_steps_follow_the_codes_conversion():
    assert STEPS == DetectorSteps(20, 10, 20)
    assert DetectorSteps.from_ratios(500, 5, 0.2, 0.1, 0.2) == DetectorSteps(20, 10, 20)


def test_constant_variance_fires_at_the_first_step_past_protection_with_a_reference():
    assert feed([1.0] * 40).stable_step == STEPS.ref_end + 1  # the reference exists only after ref_end


def test_variance_that_becomes_constant_fires_once_the_window_is_constant():
    values = [2.0**u for u in range(30)] + [2.0**30] * 20
    det = feed(values)
    assert det.stable_step == 34  # window = steps 30..34, the first with five equal values
    assert feed(values[:34]).stable_step is None


def test_window_std_above_ratio_times_reference_never_fires():
    det = feed([1.0, 2.0] * 40)  # reference 1.5, window std 0.49 > 0.3 x 1.5
    assert det.stable_step is None and det.relative_stability() > 0.3


def test_once_stable_always_stable_and_theta_follows_eq6():
    det = feed([1.0] * 25 + [1.0, 50.0] * 10)
    assert det.stable_step == 21 and det.is_stable
    kw = dict(rounds=100, test_round=1, kappa=0.5, **SCHEDULE)
    assert client_threshold(det, 21, **kw) == pytest.approx(threshold_at(0.0, **SCHEDULE))
    assert client_threshold(det, 21 + 20, **kw) == pytest.approx(0.5)  # p = 20 / (0.5 * 100) = 0.4
    assert client_threshold(feed([1.0, 2.0] * 40), 90, **kw) == 0.75


# §10.5 cosine similarity and topology
def test_cosine_matches_torch():
    x = torch.randn(M, 3, 4, dtype=torch.float64)
    cos = cosine_matrix(x.reshape(M, -1))
    for i in range(M):
        for j in range(M):
            ref = F.cosine_similarity(x[i].reshape(1, -1), x[j].reshape(1, -1))
            assert cos[i, j].item() == pytest.approx(ref.item(), abs=1e-12)


def test_paper_topology():
    a = adjacency(NB)
    check_topology(NB)
    assert np.array_equal(a, a.T) and (a.sum(1) == 4).all() and a.sum() // 2 == 20 and np.trace(a) == 0
    assert diameter(NB) == 3
    with pytest.raises(ValueError, match="not symmetric"):
        check_topology([[1], [2], [0]])


# local training: the batched clients reproduce torch's SGD per client
def reference_sgd(net, x, y, batches, lr, momentum):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    for idx in batches:
        opt.zero_grad()
        F.cross_entropy(net(x[idx]), y[idx]).backward()
        opt.step()
    return {k: v.detach() for k, v in net.state_dict().items()}


@pytest.mark.parametrize("backend", [BatchedMLP, ModuleClients])
def test_local_round_matches_torch_sgd_per_client(backend):
    torch.manual_seed(0)
    x, y = torch.randn(300, 6), torch.randint(0, 4, (300,))
    parts = [np.arange(s, s + n) for s, n in zip(range(0, 300, 30), (30, 12, 25, 7, 30, 18, 30, 3, 22, 30))]
    net = mlp(6, [8, 5], 4)
    states = stack_states(net, M)
    states = {k: v + 0.01 * torch.randn_like(v) for k, v in states.items()}  # clients start apart
    plan = batch_plan(parts, 8, 2, np.random.default_rng(0))
    out = local_round(backend(net), states, x, y, plan, lr=0.1, momentum=0.5)
    for i in range(M):
        ref_net = mlp(6, [8, 5], 4)
        ref_net.load_state_dict({k: v[i] for k, v in states.items()})
        ref = reference_sgd(ref_net, x, y, plan[i], 0.1, 0.5)
        for k in ref:
            assert torch.allclose(out[k][i], ref[k], atol=1e-6), (i, k)


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3),
        torch.nn.BatchNorm2d(3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(3 * 4 * 4, 4),
    )


def test_looped_clients_with_batchnorm_match_torch_per_client():
    """The paper-scale path: BatchNorm statistics update in each client's own slice of the stacked state."""
    torch.manual_seed(2)
    x, y = torch.randn(120, 1, 6, 6), torch.randint(0, 4, (120,))
    parts = [np.arange(12 * i, 12 * i + 12) for i in range(M)]
    net = small_cnn()
    states = {
        k: v + (0.01 * torch.randn_like(v) if v.is_floating_point() else 0) for k, v in stack_states(net, M).items()
    }
    plan = batch_plan(parts, 5, 2, np.random.default_rng(1))
    out = local_round(ModuleClients(net), states, x, y, plan, lr=0.1, momentum=0.5)
    for i in (0, 4, 9):
        ref_net = small_cnn()
        ref_net.load_state_dict({k: v[i] for k, v in states.items()})
        ref = reference_sgd(ref_net.train(), x, y, plan[i], 0.1, 0.5)
        for k in ref:
            assert torch.allclose(out[k][i].to(ref[k].dtype), ref[k], atol=1e-5), (i, k)
    assert not torch.allclose(out["1.running_mean"][0], out["1.running_mean"][1])


def test_dpsgd_gossip_keeps_the_average_of_identical_gradients_steps():
    torch.manual_seed(1)
    x, y = torch.randn(100, 6), torch.randint(0, 3, (100,))
    net = mlp(6, [4], 3)
    states = stack_states(net, M)
    plan = batch_plan([np.arange(100)] * M, 10, 1, np.random.default_rng(0))
    plan = [plan[0]] * M  # every client sees the same batches: gossip of identical models is the identity
    solo = local_round(BatchedMLP(net), states, x, y, plan, 0.1, 0.5)
    gossip = local_round(BatchedMLP(net), states, x, y, plan, 0.1, 0.5, gossip=metropolis_mixing(NB))
    for k in solo:
        assert torch.allclose(solo[k], gossip[k], atol=1e-6)


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """The tiny pipeline's data stages on the bundled digits: train/test Parquet files and seeds 0 and 1's IID
    partitions."""
    from paperflow.decfus.prepare import download, partition, preprocess

    tmp = tmp_path_factory.mktemp("decfus_digits")
    cfg = load_paper_config("decfus", "tiny")
    spec = cfg["datasets"]["digits"]
    download("digits", spec, tmp, tmp / "raw.parquet")
    preprocess(tmp / "raw.parquet", spec, tmp / "train.parquet", tmp / "test.parquet")
    for seed in (0, 1):
        partition(tmp / "train.parquet", M, cfg["partitions"]["iid"], seed, tmp / f"iid{seed}.json")
    return cfg, tmp


def train_with(
    engine: str, digits_files, out_dir, seeds=(0, 1), parts=None, method="dpsgd", checkpoint_dir=None, **train
):
    """train_run on 3 rounds of the digits on the CPU; seed s on the IID partition of parts.get(s, s)."""
    from paperflow.decfus.training import train_run

    cfg, data = digits_files
    out_dir.mkdir(parents=True, exist_ok=True)
    out = {
        k: str(out_dir / f) for k, f in (("curves", "curves.csv"), ("clients", "clients.csv"), ("checkpoint", "f.pt"))
    }
    info = train_run(
        method=method,
        train_file=str(data / "train.parquet"),
        test_file=str(data / "test.parquet"),
        partition_files={s: str(data / f"iid{(parts or {}).get(s, s)}.json") for s in seeds},
        seeds=list(seeds),
        model=cfg["model"],
        train=cfg["train"] | {"rounds": 3, "device": "cpu", "engine": engine} | train,
        decfus=cfg["decfus"],
        out=out,
        run_dir=out_dir / "logs",
        wandb=None,
        tags={"paper": "decfus"},
        checkpoint_dir=checkpoint_dir,
    )
    ckpt = torch.load(out["checkpoint"], weights_only=False)
    return info, pd.read_csv(out["curves"]), pd.read_csv(out["clients"]), ckpt


@pytest.mark.parametrize("backend", ["batched", "looped"])
def test_loop_and_lightning_engines_train_the_same_models(tmp_path, digits_files, one_thread, backend):
    """train.engine: the plain loop (tiny/smoke/cpu) and Lightning Fabric (paper) run the same rounds, D-PSGD's
    gossip after every step included: on the CPU bit-identical client states (BatchNorm-free MLP, float32), curves
    and per-client logs, and the Fabric's CSV log holds the same evaluations. Both backends (looped is the paper's)."""
    (info, curves, clients, ckpt), (info2, curves2, clients2, ckpt2) = (
        train_with(engine, digits_files, tmp_path / engine, backend=backend) for engine in ("loop", "lightning")
    )
    assert info["engine"] == "loop" and info2["engine"] == "lightning" and info2["device"] == "cpu"
    assert ckpt.keys() == ckpt2.keys() and ckpt["states"].keys() == ckpt2["states"].keys() == {0, 1}
    for seed, states in ckpt["states"].items():
        assert states.keys() == ckpt2["states"][seed].keys()
        for k, v in states.items():
            assert torch.equal(v, ckpt2["states"][seed][k]), (seed, k)
    pd.testing.assert_frame_equal(curves, curves2, check_exact=True)
    pd.testing.assert_frame_equal(clients, clients2, check_exact=True)
    logged = pd.read_csv(tmp_path / "lightning" / "logs" / "csv" / "dpsgd" / "metrics.csv")
    for seed, c in curves.groupby("seed"):
        rows = logged.dropna(subset=[f"seed{seed}/test_acc"])
        np.testing.assert_array_equal(rows.step, c["round"])
        np.testing.assert_allclose(rows[f"seed{seed}/test_acc"], c.test_acc, rtol=1e-15)  # CSV round trip
    assert curves.test_loss.iloc[-1] < curves.test_loss.iloc[0]  # it trained
    # and the run's seed and every round matter: seed 2 on seed 1's clients, or one round fewer, is another model
    seed2 = train_with("lightning", digits_files, tmp_path / "seed", seeds=(2,), parts={2: 1}, backend=backend)[3]
    fewer = train_with("lightning", digits_files, tmp_path / "rounds", seeds=(1,), rounds=2, backend=backend)[3]
    for other in (seed2["states"][2], fewer["states"][1]):
        assert not torch.equal(other["0.weight"], ckpt["states"][1]["0.weight"])


@pytest.mark.parametrize("engine", ["loop", "lightning"])
def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_run(tmp_path, digits_files, one_thread, monkeypatch, engine):
    """decfus_train hands each seed's run a folder under the job's checkpoint_dir(): DecFus killed in round 4 of 6
    (saving every round here; every 30 min in a job) and rerun ends with the uninterrupted run's client states,
    curves and client rows (thresholds, detectors, batch-plan and fusion generators restored with the states); a
    finished run rerun simulates no round. Both engines."""
    import functools

    from paperflow.decfus import simulation, training

    monkeypatch.setattr(training, "simulate", functools.partial(simulation.simulate, checkpoint_every_s=0.0))
    kwargs = {"seeds": (0,), "method": "decfus", "rounds": 6, "test_round": 1}
    clean = train_with(engine, digits_files, tmp_path / "clean", **kwargs)
    local_round, calls = simulation.local_round, []

    def dies_in_round_4(*args):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed")
        return local_round(*args)

    monkeypatch.setattr(simulation, "local_round", dies_in_round_4)
    with pytest.raises(RuntimeError, match="killed"):
        train_with(engine, digits_files, tmp_path / "run", checkpoint_dir=tmp_path / "ckpt", **kwargs)
    monkeypatch.setattr(simulation, "local_round", local_round)
    resumed = train_with(engine, digits_files, tmp_path / "run", checkpoint_dir=tmp_path / "ckpt", **kwargs)
    monkeypatch.setattr(simulation, "local_round", lambda *a: pytest.fail("a finished run simulated a round"))
    reloaded = train_with(engine, digits_files, tmp_path / "run", checkpoint_dir=tmp_path / "ckpt", **kwargs)
    for _, curves, clients, ckpt in (resumed, reloaded):
        for k, v in clean[3]["states"][0].items():
            assert torch.equal(v, ckpt["states"][0][k]), k
        pd.testing.assert_frame_equal(curves, clean[1], check_exact=True)
        pd.testing.assert_frame_equal(clients, clean[2], check_exact=True)
    assert clean[2].theta.nunique() > 1  # the thresholds moved: their restore is tested


def test_an_evaluation_killed_mid_job_resumes_from_the_journal(tmp_path, digits_files, one_thread, monkeypatch):
    """decfus_evaluate journals each evaluated training run in the job's checkpoint folder: a job killed in its second
    run and rerun evaluates only the runs left and returns the uninterrupted job's frame exactly; a finished job
    rerun evaluates nothing."""
    from paperflow.decfus import evaluation

    cfg, data = digits_files
    runs = []
    for method in ("dpsgd", "decfus"):
        train_with("loop", digits_files, tmp_path / method, method=method)
        files = {k: str(tmp_path / method / f) for k, f in (("curves", "curves.csv"), ("clients", "clients.csv"))}
        runs.append({"method": method, **files, "checkpoint": str(tmp_path / method / "f.pt")})

    def run(journal):
        return evaluation.evaluate(runs, str(data / "test.parquet"), 2, "batched", 256, "cpu", journal=journal)

    clean = run(None)
    fused, calls = evaluation.fused_accuracy, []

    def dies_in_run_2(checkpoint, *args):
        calls.append(checkpoint)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return fused(checkpoint, *args)

    monkeypatch.setattr(evaluation, "fused_accuracy", dies_in_run_2)
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "runs.jsonl")
    calls.clear()
    monkeypatch.setattr(evaluation, "fused_accuracy", lambda c, *a: (calls.append(c), fused(c, *a))[1])
    pd.testing.assert_frame_equal(run(tmp_path / "runs.jsonl"), clean, check_exact=True)
    assert calls == [runs[1]["checkpoint"]]
    calls.clear()
    pd.testing.assert_frame_equal(run(tmp_path / "runs.jsonl"), clean, check_exact=True)
    assert calls == [] and len(clean) == 4


def test_an_unknown_engine_is_refused_by_name(tmp_path, digits_files, repo_copy):
    import yaml

    with pytest.raises(ValueError, match=r"train.engine = 'keras': not one of \('loop', 'lightning'\)"):
        train_with("keras", digits_files, tmp_path)
    with pytest.raises(ValueError, match="train.engine = 'lightning' but simulate got no Fabric"):
        run_schedule(1e9, rounds=2, engine="lightning")
    path = repo_copy / "config" / "decfus.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["paper"]["train"]["engine"] = "fabric"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="train.engine.*allowed values: 'loop', 'lightning'"):
        load_paper_config("decfus", "paper", repo_copy)


def test_paper_networks_build_and_run():
    vgg = VGG16BN(classes=10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in vgg.modules()) == 13
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in vgg.modules()) == 5
    x = torch.randn(2, 3, 32, 32)
    vgg.eval()
    assert vgg(x).shape == (2, 10)
    res = GroupedResNet50(classes=20).eval()
    assert res(x).shape == (2, 20)
    assert len([k for k in vgg.state_dict() if "num_batches_tracked" not in k]) > 40


# claims (judged by paperflow.core.claims on the config's claims): they can fail
SEEDS = list(range(6))
GATED = {  # every gated claim at smoke scale
    "decfus_gt_dflavg_dir05",
    "decfus_not_below_dflavg_iid",
    "decfus_not_above_dflavg_iid",
    *(
        f"{c}_{p}"
        for p in ("dir05", "iid")
        for c in (
            "all_clients_stable",
            "theta_ends_near_theta1",
            "averaged_fraction_rises",
            "averaged_fraction_ends_high",
        )
    ),
}


def eval_frame(acc: dict[str, list[float]], schedule: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Evaluation rows of one partition: accuracy per method and seed, schedule columns per method (a value, or a
    list over seeds)."""
    rows = []
    for m, vals in acc.items():
        for i, (s, a) in enumerate(zip(SEEDS, vals)):
            sched = {k: (v[i] if isinstance(v, list) else v) for k, v in schedule.get(m, NO_DETECTOR).items()}
            rows.append({"method": m, "seed": s, "final_acc": a, **sched})
    return pd.DataFrame(rows)


WORKING = {"stable_fraction": 1.0, "theta_final_max": 0.26, "averaged_first": 0.25, "averaged_last": 0.75}
NO_DETECTOR = {"stable_fraction": 0.0, "theta_final_max": 0.75, "averaged_first": 0.25, "averaged_last": 0.25}
DIR05 = {"decfus": [0.85, 0.86, 0.84, 0.85, 0.86, 0.85], "dflavg": [0.80, 0.81, 0.79, 0.80, 0.80, 0.81]}
IID = {"decfus": [0.92, 0.93, 0.92, 0.925, 0.92, 0.93], "dflavg": [0.921, 0.925, 0.925, 0.922, 0.924, 0.926]}


def frames_of(dir05=None, iid=None, decfus_schedule=WORKING):
    """Both claim partitions: DecFus, DFLAvg, the fixed-θ control (as DFLAvg on dir05, 3 points below it on
    IID) and D-PSGD (3 points above DFLAvg on IID)."""
    dir05 = dir05 or DIR05
    iid = iid or IID
    sched = {"decfus": decfus_schedule}
    return {
        "dir05": eval_frame({"decfus_fixed": dir05["dflavg"], "dpsgd": dir05["dflavg"], **dir05}, sched),
        "iid": eval_frame(
            {"decfus_fixed": [a - 0.03 for a in iid["dflavg"]], "dpsgd": [a + 0.03 for a in iid["dflavg"]], **iid},
            sched,
        ),
    }


def verdicts(frames, scale="smoke"):
    cfg = load_paper_config("decfus", scale)
    table = metrics_table(frames, scale)
    have = set(zip(table.method, table.metric))
    specs = [
        s for s in parse_claims(cfg["claims"], "config/decfus.yaml") if all((m, s.metric) in have for m in s.methods())
    ]
    return {v.id: v for v in judge_all(specs, table, scale)}


def gated(frames):
    return {k: v.verdict for k, v in verdicts(frames).items() if v.gated}


def test_claims_hold_for_a_working_decfus():
    found = verdicts(frames_of())
    assert {k: v.verdict for k, v in found.items() if v.gated} == dict.fromkeys(GATED, HELD)
    gt = found["decfus_gt_dflavg_dir05"]
    assert gt.central and gt.control["method"] == "decfus_fixed" and gt.control["verdict"] != HELD
    assert gt.value == pytest.approx(np.mean(DIR05["decfus"]) - np.mean(DIR05["dflavg"])) and gt.ci_low > 0
    assert found["all_clients_stable_dir05"].ci_method == "exact (worst seed)"


def test_the_fixed_theta_control_as_good_as_decfus_voids_the_accuracy_claim():
    frames = frames_of()
    fixed = frames["dir05"].method == "decfus_fixed"
    frames["dir05"].loc[fixed, "final_acc"] = DIR05["decfus"]
    found = gated(frames)
    assert found["decfus_gt_dflavg_dir05"] == CONTROL_HOLDS
    assert {k for k, v in found.items() if v != HELD} == {"decfus_gt_dflavg_dir05"}


def test_dflavg_in_decfus_place_and_detector_off_fail():
    same = {"decfus": DIR05["dflavg"], "dflavg": DIR05["dflavg"]}
    found = gated(frames_of(dir05=same, iid={"decfus": [0.90] * 6, "dflavg": [0.93] * 6}, decfus_schedule=NO_DETECTOR))
    assert found["decfus_gt_dflavg_dir05"] == REFUTED and found["decfus_not_below_dflavg_iid"] == REFUTED
    for part in ("dir05", "iid"):
        for claim in (
            "all_clients_stable",
            "theta_ends_near_theta1",
            "averaged_fraction_ends_high",
            "averaged_fraction_rises",
        ):
            assert found[f"{claim}_{part}"] == REFUTED


def test_averaging_from_round_zero_and_decfus_far_above_dflavg_on_iid_fail():
    # θ starts low instead of at θ0 = 0.75 (most tensors averaged from round 0: no rise, although the last
    # round's fraction is high), and on IID DecFus beats DFLAvg by 3 points, outside the 1-point band
    iid = {"decfus": [a + 0.03 for a in IID["dflavg"]], "dflavg": IID["dflavg"]}
    found = gated(frames_of(iid=iid, decfus_schedule=WORKING | {"averaged_first": 0.75}))
    failed = {k: v for k, v in found.items() if v != HELD}
    assert failed == {
        "averaged_fraction_rises_dir05": REFUTED,
        "averaged_fraction_rises_iid": REFUTED,
        "decfus_not_above_dflavg_iid": REFUTED,
    }


def test_one_late_detector_leaves_the_rise_undecided_and_a_client_never_stable_fails_every_run():
    # one seed's detectors fire late: its fraction ends at 0.30 (rise 0.05); the mean rise (5 x 0.5 + 0.05) / 6
    # = 0.43 is above 0.40 but the interval over six seeds is not; one client of one seed never fires
    late = WORKING | {"averaged_last": [0.75] * 5 + [0.30], "stable_fraction": [1.0] * 5 + [0.9]}
    found = verdicts(frames_of(decfus_schedule=late))
    rise = found["averaged_fraction_rises_dir05"]
    assert rise.value == pytest.approx((5 * 0.5 + 0.05) / 6) and rise.verdict == INCONCLUSIVE
    assert rise.n_needed is not None and rise.n_needed > 6
    assert found["all_clients_stable_dir05"].verdict == REFUTED and found["all_clients_stable_dir05"].value == 0.9


def test_the_round_zero_fraction_is_fixed_by_theta0_whatever_the_models():
    """Why `averaged_fraction_starts_low` was no claim: at θ0 = 0.75 the percentile split averages 2 of 8
    tensors for any snapshot, so only the rise over a run measures anything."""
    for seed in range(20):
        states = {k: v * 10.0 ** (seed % 5 - 2) for k, v in random_states(seed, shapes=[(4, 3), (3,)] * 4).items()}
        fusion = decfus_fusion(states, NB, list(range(5, 5 + M)), [0.75] * M, 0.4, np.random.default_rng(seed))
        assert fusion.averaged.mean() == 0.25


def run_schedule(stability_ratio: float, rounds: int = 10, method: str = "decfus", engine: str = "loop"):
    """A real run on random data, DecFus's detector made to fire at once (huge ratio) or never (0)."""
    from paperflow.decfus.evaluation import curve_metrics
    from paperflow.decfus.simulation import simulate

    cfg = load_paper_config("decfus", "tiny")
    g = np.random.default_rng(0)
    x, y = g.normal(size=(400, 64)).astype(np.float32), g.integers(0, 10, 400)
    run = simulate(
        method=method,
        x_train=x,
        y_train=y,
        x_test=x[:100],
        y_test=y[:100],
        parts=np.array_split(np.arange(400), M),
        neighbours=NB,
        classes=10,
        model=cfg["model"],
        train=cfg["train"] | {"rounds": rounds, "device": "cpu", "engine": engine},
        decfus=cfg["decfus"] | {"stability_ratio": stability_ratio},
        seed=0,
    )
    return curve_metrics(run.curves, run.clients, 5)


def test_the_rise_on_real_runs_is_there_when_the_detector_fires_and_not_when_it_never_does_or_is_off(one_thread):
    runs = {"fires": run_schedule(1e9), "never": run_schedule(0.0), "fixed": run_schedule(1e9, method="decfus_fixed")}
    frame = pd.DataFrame([{"method": k, "seed": 0, **v} for k, v in runs.items()])
    table = metrics_table({"p": frame}, "tiny").set_index(["method", "metric"]).value
    assert table["fires", "p/stable_fraction"] == 1 and table["fires", "p/averaged_rise"] >= 0.4
    for off in ("never", "fixed"):  # the detector never fires, or the phase control is off: θ stays at θ0
        assert table[off, "p/stable_fraction"] == 0 and table[off, "p/averaged_rise"] == 0
        assert table[off, "p/theta_final_max"] == 0.75
    assert runs["never"]["averaged_first"] == runs["fires"]["averaged_first"] == 0.25  # round 0 tells them apart not


def test_a_missing_seed_gives_no_data():
    frames = frames_of()
    frames["dir05"] = frames["dir05"][~((frames["dir05"].method == "decfus") & (frames["dir05"].seed == 2))]
    found = gated(frames)
    assert found["decfus_gt_dflavg_dir05"] == NO_DATA and found["decfus_not_below_dflavg_iid"] == HELD


def test_a_misspelt_claim_metric_is_refused_when_the_config_loads(repo_copy):
    path = repo_copy / "config" / "decfus.yaml"
    path.write_text(path.read_text().replace('metric: "dir05/final_acc"', 'metric: "dir05/final_ac"', 1))
    with pytest.raises(ConfigError, match=r"claims\[0\] \(decfus_gt_dflavg_dir05\)\.metric = 'dir05/final_ac'"):
        load_paper_config("decfus", "smoke", repo_copy)


def test_limitations_follow_the_config():
    def lines(scale, **train):
        cfg = load_paper_config("decfus", scale)
        return limitations(scale, cfg["run_datasets"], cfg["model"], cfg["train"] | train)

    smoke = lines("smoke")
    assert "with an MLP (hidden widths 64-64-32) for 40 rounds of 1 local epoch(s)" in smoke[0]
    assert "MLP of 8 tensors" in smoke[-1]
    assert "for 25 rounds of 2 local epoch(s)" in lines("smoke", rounds=25, local_epochs=2)[0]
    paper = " ".join(lines("paper"))
    assert "Scale" not in paper and "MLP" not in paper


# data and partitions
def test_partitions():
    labels = np.random.default_rng(0).integers(0, 10, 1437)
    for parts in (
        dirichlet_partition(labels, M, 0.1, np.random.default_rng(1)),
        iid_partition(len(labels), M, np.random.default_rng(1)),
    ):
        flat = np.concatenate(parts)
        assert len(flat) == len(set(flat.tolist())) and min(len(p) for p in parts) >= 10
    assert {len(p) for p in iid_partition(1437, M, np.random.default_rng(0))} == {143}
    skew = dirichlet_partition(labels, M, 0.1, np.random.default_rng(2))
    assert max(np.bincount(labels[p], minlength=10).max() / len(p) for p in skew) > 0.5  # β = 0.1 is strongly non-IID


def cifar_archive(path, members, label_bytes, n=4):
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for name in members:
            rec = rng.integers(0, 256, (n, label_bytes + 3072), dtype=np.uint8)
            rec[:, :label_bytes] %= 10
            info = tarfile.TarInfo(f"cifar-binary/{name}")
            info.size = rec.nbytes
            tar.addfile(info, io.BytesIO(rec.tobytes()))
    return path


def test_cifar_binary_reader_and_checksummed_download(tmp_path):
    members = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    archive = cifar_archive(tmp_path / "cifar-10-binary.tar.gz", members, 1)
    pixels, labels = read_cifar_binary(archive, ["test_batch.bin"], 1, 0)
    assert pixels.shape == (4, 3, 32, 32) and labels.max() < 10
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    frame = acquire("cifar10", {"kind": "cifar10", "url": archive.as_uri(), "sha256": sha}, tmp_path / "cache")
    assert (frame.split == "train").sum() == 20 and (frame.split == "test").sum() == 4
    with pytest.raises(ConfigError, match="sha256 is not set"):
        acquire("cifar10", {"kind": "cifar10", "url": archive.as_uri(), "sha256": None}, tmp_path / "cache")


def test_svhn_reader_maps_label_ten_to_zero(tmp_path):
    from scipy.io import savemat

    x = np.random.default_rng(0).integers(0, 256, (32, 32, 3, 5), dtype=np.uint8)
    savemat(tmp_path / "t.mat", {"X": x, "y": np.array([[10], [1], [2], [10], [9]])})
    pixels, labels = read_svhn_mat(tmp_path / "t.mat")
    assert labels.tolist() == [0, 1, 2, 0, 9] and pixels.shape == (5, 3, 32, 32)
    assert np.array_equal(pixels[1, 2], x[:, :, 2, 1])


# config
def test_config_errors_name_the_key(repo_copy):
    import yaml

    path = repo_copy / "config" / "decfus.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["smoke"] = {"methods": ["decfus", "dfedsam"]}
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="allowed values: 'decfus', 'decfus_fixed', 'dflavg'"):
        load_paper_config("decfus", "smoke", repo_copy)
    cfg["smoke"] = {"model": {"arch": "vgg16_bn"}}
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="backend = 'batched' runs only"):
        load_paper_config("decfus", "smoke", repo_copy)


def test_a_run_rejects_an_unknown_config_key():
    from paperflow.decfus.simulation import simulate

    cfg = load_paper_config("decfus", "tiny")
    blocks = {"model": cfg["model"], "train": cfg["train"], "decfus": cfg["decfus"]}
    for name in blocks:
        bad = blocks | {name: blocks[name] | {"warmup": 3}}
        with pytest.raises(ConfigError, match=f"decfus {name}: unknown key\\(s\\) 'warmup'"):
            simulate(
                method="decfus",
                x_train=np.zeros((4, 64), np.float32),
                y_train=np.zeros(4, np.int64),
                x_test=np.zeros((4, 64), np.float32),
                y_test=np.zeros(4, np.int64),
                parts=[np.arange(4)] * M,
                neighbours=NB,
                classes=10,
                seed=0,
                **bad,
            )


def test_every_scale_resolves():
    for scale in ("tiny", "smoke", "cpu", "paper"):
        cfg = load_paper_config("decfus", scale)
        assert cfg["clients"] == M
    cpu = load_paper_config("decfus", "cpu")
    assert cpu["seeds"] == list(range(10))
    # the spec's round budget and evaluation step (§2.3) on smoke's digits MLP
    assert (cpu["train"]["rounds"], cpu["train"]["test_round"]) == (500, 5)
    assert cpu["train"]["lr"] == load_paper_config("decfus", "smoke")["train"]["lr"]
    assert load_paper_config("decfus", "paper")["resources"]["gpus"] >= 1
    assert load_paper_config("decfus", "smoke")["resources"]["gpus"] == 0


# §10.6 the smoke claims, measured here from the library (the pipeline's report states every claim)
SMOKE_PARTS = ("iid", "dir05")
# every gated smoke claim's verdict on 3 seeds, so a change of outcome fails. With R = 40 some clients' detectors
# fire late (the report lists each client's detection round), leaving too few of the κR = 20 rounds of the
# sigmoid for θ to descend: the θ and end-fraction claims are undecided on 3 seeds (workflows/decfus/README.md).
# DecFus with θ held at θ0 beats DFLAvg on dir05 and stays within a point of it on IID as well, so those two
# claims are voided by their control.
SMOKE_VERDICTS = {
    "decfus_gt_dflavg_dir05": CONTROL_HOLDS,
    "decfus_not_below_dflavg_iid": CONTROL_HOLDS,
    "decfus_not_above_dflavg_iid": HELD,
    "all_clients_stable_dir05": HELD,
    "all_clients_stable_iid": HELD,
    "theta_ends_near_theta1_dir05": INCONCLUSIVE,
    "theta_ends_near_theta1_iid": INCONCLUSIVE,
    "averaged_fraction_rises_dir05": INCONCLUSIVE,
    "averaged_fraction_rises_iid": HELD,
    "averaged_fraction_ends_high_dir05": INCONCLUSIVE,
    "averaged_fraction_ends_high_iid": INCONCLUSIVE,
}


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """DecFus, its fixed-θ control, DFLAvg and D-PSGD at smoke scale on both claim partitions, every seed, one
    torch thread (as the job)."""
    from paperflow.decfus.evaluation import curve_metrics
    from paperflow.decfus.prepare import download, partition, preprocess, read_partition
    from paperflow.decfus.simulation import simulate
    from paperflow.decfus.training import load_split

    tmp = tmp_path_factory.mktemp("decfus_smoke")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = load_paper_config("decfus", "smoke")
    spec = cfg["datasets"]["digits"]
    download("digits", spec, tmp, tmp / "raw.parquet")
    preprocess(tmp / "raw.parquet", spec, tmp / "train.parquet", tmp / "test.parquet")
    x_train, y_train, meta = load_split(tmp / "train.parquet")
    x_test, y_test, _ = load_split(tmp / "test.parquet")
    frames, logs = {}, []
    for part in SMOKE_PARTS:
        rows = []
        for seed in cfg["seeds"]:
            partition(tmp / "train.parquet", M, cfg["partitions"][part], seed, tmp / f"{part}{seed}.json")
            parts = read_partition(tmp / f"{part}{seed}.json")
            for method in ("decfus", "decfus_fixed", "dflavg", "dpsgd"):
                run = simulate(
                    method=method,
                    x_train=x_train,
                    y_train=y_train,
                    x_test=x_test,
                    y_test=y_test,
                    parts=parts,
                    neighbours=NB,
                    classes=meta["classes"],
                    model=cfg["model"],
                    train=cfg["train"],
                    decfus=cfg["decfus"],
                    seed=seed,
                )
                metrics = curve_metrics(run.curves, run.clients, cfg["evaluate"]["tail"])
                rows.append({"method": method, "seed": seed, **metrics})
                if method == "decfus":
                    logs.append(run.clients)
        frames[part] = pd.DataFrame(rows)
    torch.set_num_threads(threads)
    table = metrics_table(frames, "smoke")
    specs = [s for s in parse_claims(cfg["claims"], "decfus") if s.gated_at("smoke")]
    claims = {v.id: v for v in judge_all(specs, table, "smoke")}
    return cfg, claims, logs


@pytest.mark.slow
def test_smoke_verdict_of_every_gated_claim_over_three_seeds(smoke_runs):
    _, claims, _ = smoke_runs
    assert set(claims) == set(SMOKE_VERDICTS) == GATED
    assert {k: v.verdict for k, v in claims.items()} == SMOKE_VERDICTS


@pytest.mark.slow
def test_smoke_schedule_follows_the_detector(smoke_runs):
    """θ never rises and never passes θ1; no client fires during the protection period."""
    cfg, _, logs = smoke_runs
    for clients in logs:
        theta = clients.pivot(index="round", columns="client", values="theta")
        assert (theta.diff().dropna() <= 1e-12).all().all() and (theta >= 0.25).all().all()
        stable = clients.groupby("client").stable_round.last()
        assert (stable.dropna() > int(cfg["decfus"]["protection"] * cfg["train"]["rounds"])).all()
