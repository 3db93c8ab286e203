"""st_gfn's paper-scale tasks at toy sizes: noisy sequence generation on torchgfn's BitSequence and the
single-cell perturbation task (GSE133344's file format, the reconstructed proxy, torchgfn's SetAddition):
the spec's section-10 identities on their real torchgfn trajectories, agreement of our sequence and set
bookkeeping with torchgfn's own, the parser against scipy's Matrix Market reader, the refusal to download
unpinned data, a real HTTP download with checksums, and the Lightning engine reproducing the plain loop."""

from __future__ import annotations

import functools
import hashlib
import http.server
import itertools
import json
import math
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.io
import torch
import yaml
from conftest import run_snakemake
from test_st_gfn import config_root

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import ChecksumMismatch
from paperflow.core.provenance import audit
from paperflow.st_gfn import perturbation, sequences
from paperflow.st_gfn.envs import make_env, make_preprocessor, state_keys, terminal_record
from paperflow.st_gfn.evaluation import evaluate_env
from paperflow.st_gfn.identities import identity_gaps
from paperflow.st_gfn.training import TrainingRun, train_one

ROOT = Path(__file__).resolve().parents[2]
BITS = {
    "kind": "bitseq",
    "word_size": 2,
    "seq_size": 8,
    "n_modes": 4,
    "temperature": 1.0,
    "mode_seed": 0,
    "mode_distance": 1,
    "sigma": 1.0,
}
GENESET = {
    "kind": "geneset",
    "source": "synthetic_norman",
    "synthetic_seed": 0,
    "k": 2,
    "min_cells": 10,
    "n_response_genes": 20,
    "target": None,
    "tau": 1.0,
    "n_modes": 3,
    "sigma": 0.5,
}
MODEL = {"hidden": 32, "layers": 2}
TRAIN = {
    "iterations": 12,
    "batch_size": 16,
    "lr": 1e-3,
    "lr_logz": 0.1,
    "epsilon": 0.05,
    "grad_clip": 1.0,
    "engine": "loop",
}


def methods():
    return load_paper_config("st_gfn", "smoke", ROOT)["methods"]


@pytest.fixture(scope="module")
def norman_files(tmp_path_factory) -> dict[str, Path]:
    return perturbation.write_synthetic_norman(tmp_path_factory.mktemp("norman"), seed=0)


@pytest.fixture(scope="module")
def gene_target(norman_files) -> tuple[pd.DataFrame, dict]:
    return perturbation.target(perturbation.pseudobulk(norman_files, progress=False), GENESET)


# --- noisy sequence generation (torchgfn BitSequence) ----------------------------------------------------


def test_bitseq_identities_hold_on_real_torchgfn_trajectories():
    """Spec 10.1-10.2 on BitSequence: sum L_ST(0) = torchgfn's DB loss, n L_ST(DC) = torchgfn's TB loss."""
    env = make_env(BITS)
    for seed, time_features in ((0, 0), (1, 4)):
        gaps = identity_gaps(env, hidden=32, layers=2, batch=16, seed=seed, time_features=time_features)
        assert gaps["lam0_db_gap"] < 1e-5 * max(1.0, gaps["db_sum"]) and gaps["dc_tb_gap"] < 1e-4
        assert gaps["db_sum"] > 1e-3


def test_sequence_distances_agree_with_torchgfn_rewards():
    env = make_env(dict(BITS, seq_size=16, word_size=4, n_modes=6, temperature=2.0))
    states = env.terminating_states[torch.randperm(2**16, generator=torch.Generator().manual_seed(0))[:200]]
    bits = sequences.words_to_bits(states.tensor.numpy(), 4)
    np.testing.assert_array_equal(bits, env.integers_to_binary(states.tensor, 4).numpy())
    modes = sequences.reference_modes(env).to_numpy()
    distance = sequences.distance_to_modes(bits, modes).min(axis=1)
    np.testing.assert_allclose(-distance / 2.0, env.log_reward(states).numpy(), rtol=0, atol=1e-6)


def test_modes_found_and_top_k_on_a_hand_example():
    modes = np.array([[0, 0, 0, 0], [1, 1, 1, 1]])
    seqs = np.array([[0, 0, 0, 1], [0, 0, 0, 1], [1, 0, 1, 0]])
    assert sequences.modes_found(seqs, modes, within=1) == 1 and sequences.modes_found(seqs, modes, within=2) == 2
    reward, diversity = sequences.top_k(seqs, modes, temperature=1.0, k=2)
    assert reward == pytest.approx((math.exp(-1) + math.exp(-2)) / 2)  # duplicates counted once
    assert diversity == pytest.approx(3.0)  # 0001 vs 1010


def test_bitseq_preprocessor_codes_slots_and_time():
    env = make_env(BITS)
    pre = make_preprocessor(env, time_features=4)
    states = env.reset(batch_shape=(3,))
    x = pre(states)
    assert x.shape == (3, env.words_per_seq * (2**2 + 2) + 8)
    assert torch.equal(x[:, : 2**2 + 2].argmax(-1), torch.zeros(3, dtype=torch.long))  # empty slot = value -1


@pytest.mark.parametrize("name", ["tb", "db", "subtb", "st_gfn"])
def test_every_method_trains_on_noisy_bit_sequences(name):
    env = make_env(BITS)
    _, history, visits = train_one(env, BITS, methods()[name], MODEL, TRAIN, seed=1, progress=False)
    assert np.isfinite(history.loss).all() and len(visits) == 12 * 16
    assert [c for c in visits.columns if c.startswith("w")] == [f"w{j}" for j in range(env.words_per_seq)]
    assert visits.filter(like="w").to_numpy().min() >= 0  # complete sequences only


def test_hashed_visit_keys_are_deterministic_and_spread():
    env = make_env(BITS)
    states = env.terminating_states
    keys = state_keys(env, states.tensor)
    assert torch.equal(keys, state_keys(env, states.tensor.clone())) and keys.unique().numel() > 0.95 * len(keys)


# --- single-cell perturbation (GSE133344 format, proxy, SetAddition) ---------------------------------------


@pytest.mark.parametrize(
    "guide, condition",
    [
        ("AHR_KLF1__AHR_KLF1", "AHR+KLF1"),
        ("KLF1_AHR__KLF1_AHR", "AHR+KLF1"),
        ("CEBPE_NegCtrl0__CEBPE_NegCtrl0", "CEBPE"),
        ("NegCtrl10_NegCtrl0__NegCtrl10_NegCtrl0", "ctrl"),
    ],
)
def test_guide_identities_become_conditions(guide, condition):
    assert perturbation.condition_of(guide) == condition


def test_pseudobulk_matches_scipy_matrix_market_sums(norman_files):
    bulk = perturbation.pseudobulk(norman_files, chunk_entries=1000, progress=False).set_index("condition")
    counts = scipy.io.mmread(norman_files["matrix"]).toarray()  # genes x cells
    barcodes = pd.read_csv(norman_files["barcodes"], header=None)[0]
    identity = perturbation.read_identities(norman_files["identities"]).set_index("cell_barcode")["condition"]
    genes = pd.read_csv(norman_files["genes"], sep="\t", header=None)[1]
    want = pd.DataFrame(counts.T, columns=genes).groupby(identity.loc[barcodes].to_numpy()).sum()
    assert sorted(bulk.index) == sorted(want.index) and "ctrl" in bulk.index and "GENE0+GENE1" in bulk.index
    np.testing.assert_allclose(bulk.loc[want.index, want.columns].to_numpy(), want.to_numpy())
    assert (bulk["n_cells"] == 30).all()


def test_a_file_that_is_not_matrix_market_is_refused(tmp_path, norman_files):
    broken = tmp_path / "broken.mtx.gz"
    shutil.copy(norman_files["genes"], broken)
    with pytest.raises(ValueError, match="not a coordinate Matrix Market file"):
        perturbation.pseudobulk(dict(norman_files, matrix=broken), progress=False)


def test_a_barcode_listed_twice_is_refused(tmp_path, norman_files):
    frame = pd.read_csv(norman_files["identities"])
    doubled = tmp_path / "identities.csv.gz"
    pd.concat([frame, frame.iloc[:1]]).to_csv(doubled, index=False)
    with pytest.raises(ValueError, match="listed more than once"):
        perturbation.pseudobulk(dict(norman_files, identities=doubled), progress=False)


def test_additive_proxy_and_exact_target(gene_target, norman_files):
    frame, meta = gene_target
    genes = meta["genes"]
    assert len(genes) == 6 and len(frame) == math.comb(6, 2) and meta["target"] == "GENE4+GENE5"
    assert frame["pi"].sum() == pytest.approx(1.0) and frame["is_mode"].sum() == 3
    assert not set(genes) & set(meta["response_genes"])  # the perturbed genes never score themselves
    # the additive proxy by hand for one set
    profiles = perturbation.log_profiles(perturbation.pseudobulk(norman_files, progress=False))
    shift = (profiles - profiles.loc["ctrl"])[meta["response_genes"]]
    predicted, target = shift.loc["GENE0"] + shift.loc["GENE2"], shift.loc["GENE4+GENE5"]
    want = -((predicted - target) ** 2).sum() / float((target**2).sum())
    assert frame.set_index("genes").loc["GENE0+GENE2", "log_reward"] == pytest.approx(want)
    assert 0.5 < meta["additive_r"] <= 1  # the generator's doubles are additive plus a small interaction


def test_colex_ranks_enumerate_the_sets_in_order():
    sets = sorted(itertools.combinations(range(7), 3), key=lambda s: s[::-1])
    np.testing.assert_array_equal(perturbation.colex_rank(np.array(sets)), np.arange(math.comb(7, 3)))


def test_geneset_env_rewards_and_records_match_the_target(gene_target):
    frame, _ = gene_target
    env = make_env(GENESET, frame)
    finals = torch.zeros(len(frame), env.n_items)
    for row, items in enumerate(frame["items"]):
        finals[row, [int(i) for i in items.split()]] = 1
    states = env.states_from_tensor(finals)
    np.testing.assert_allclose(env.log_reward(states).double().numpy(), frame["log_reward"], rtol=1e-5)
    np.testing.assert_array_equal(terminal_record(env, states)["state"], frame["state"])
    with pytest.raises(ValueError, match="exactly 2 items"):
        env.reward(env.states_from_tensor(torch.ones(1, env.n_items)))


def test_geneset_identities_and_training(gene_target):
    frame, _ = gene_target
    env = make_env(GENESET, frame)
    gaps = identity_gaps(env, hidden=32, layers=2, batch=16, seed=0, time_features=4)
    assert gaps["lam0_db_gap"] < 1e-5 * max(1.0, gaps["db_sum"]) and gaps["dc_tb_gap"] < 1e-4
    for name in ("tb", "db", "subtb", "st_gfn"):
        _, history, visits = train_one(env, GENESET, methods()[name], MODEL, TRAIN, seed=0, progress=False)
        assert np.isfinite(history.loss).all() and visits.state.between(0, len(frame) - 1).all()


def test_evaluation_of_both_task_kinds(tmp_path, gene_target):
    frame, _ = gene_target
    cfg = dict(load_paper_config("st_gfn", "tiny", ROOT)["evaluate"], top_k=5, last_visited=96)
    for spec, target in ((BITS, sequences.reference_modes(make_env(BITS))), (GENESET, frame)):
        env = make_env(spec, target)
        state, history, visits = train_one(env, spec, methods()["tb"], MODEL, TRAIN, seed=0, progress=False)
        torch.save({"seed0": state}, tmp_path / "tb.pt")
        metrics, pmfs = evaluate_env(
            env,
            spec,
            target,
            {"tb": methods()["tb"]},
            [("tb", 0, tmp_path / "tb.pt", visits, history)],
            MODEL,
            [0],
            cfg,
        )
        got = set(metrics[metrics.method == "tb"].metric)
        if spec["kind"] == "bitseq":
            assert {"modes_found", "topk_reward", "topk_diversity", "loss_std_last"} <= got and pmfs.empty
        else:
            assert {"l1", "tv", "jsd", "l1_on_policy", "logz_abs_err", "modes_found"} <= got
            assert pmfs["exact"].sum() == pytest.approx(1.0)
        assert {"lam0_db_gap", "dc_tb_gap"} <= set(metrics[metrics.method == "identity"].metric)


# --- paper-scale data: refusal, real download, config errors -----------------------------------------------


def geo_spec(base_url: str, sha256: dict) -> dict:
    return dict(GENESET, source="geo", base_url=base_url, sha256=sha256)


def test_unpinned_download_is_refused_with_instructions(tmp_path):
    spec = geo_spec(
        "https://ftp.ncbi.nlm.nih.gov/geo/series/GSE133nnn/GSE133344/suppl/",
        {"matrix": None, "genes": None, "barcodes": None, "identities": None},
    )
    with pytest.raises(
        ConfigError, match=r"GSE133344_filtered_matrix.mtx.gz.*never downloads unpinned data.*sha256sum"
    ):
        perturbation.acquire("perturb", spec, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.fixture
def serve_folder():
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
        handler.log_message = lambda *args: None
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/"

    yield start
    for httpd in servers:
        httpd.shutdown()


def test_pinned_download_over_http_verifies_every_file(tmp_path, norman_files, serve_folder):
    base = serve_folder(norman_files["matrix"].parent)
    sha = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in norman_files.items()}
    got = perturbation.acquire("perturb", geo_spec(base, sha), tmp_path / "cache")
    assert {k: p.read_bytes() for k, p in got.items()} == {k: p.read_bytes() for k, p in norman_files.items()}
    with pytest.raises(ChecksumMismatch):
        perturbation.acquire("perturb", geo_spec(base, dict(sha, genes="0" * 64)), tmp_path / "other")


def test_unknown_target_names_the_available_doubles(norman_files):
    bulk = perturbation.pseudobulk(norman_files, progress=False)
    with pytest.raises(ConfigError, match=r"target = 'GENE0\+GENE9' is not a double.*available: GENE0\+GENE1"):
        perturbation.target(bulk, dict(GENESET, target="GENE0+GENE9"))


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["defaults"]["envs"]["bits"].update(seq_size=100),
            r"envs.bits.seq_size = 100 is not a multiple of word_size = 8",
        ),
        (
            lambda d: d["defaults"]["envs"]["perturb"].pop("base_url"),
            r"envs.perturb \(kind geneset\) is missing key\(s\) base_url",
        ),
        (
            lambda d: d["defaults"]["envs"]["perturb"]["sha256"].update(matrix="abc"),
            r"perturb.sha256.matrix: 'abc' does not match",
        ),
        (lambda d: d["defaults"]["envs"]["perturb"].update(source="gse"), r"allowed values: 'geo', 'synthetic_norman'"),
        (lambda d: d["paper"]["env_methods"].update(bits=["db", "st_gfn"]), r"'tb' \(methods of bits\)"),
        (
            lambda d: d["claims"][0].update(metric="bits/l1"),
            r"claims\[0\] \(l1_tb_lt_uniform_clean\)\.metric = 'bits/l1' is not a metric",
        ),
        (lambda d: d["paper"]["train"].update(engine="torch"), r"allowed values: 'loop', 'lightning'"),
    ],
    ids=["seq-size", "geo-url", "sha", "source", "task-baseline", "claims-env", "engine"],
)
def test_task_config_errors_name_the_key(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        load_paper_config("st_gfn", "paper", config_root(tmp_path, edit))


# --- the Lightning engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_name", ["hypergrid", "bitseq"])
def test_lightning_job_reproduces_the_plain_loop_on_cpu(tmp_path, env_name):
    from paperflow.st_gfn.lightning import fit_one

    spec = (
        BITS
        if env_name == "bitseq"
        else {"kind": "hypergrid", "ndim": 2, "height": 8, "R0": 0.1, "R1": 0.5, "R2": 2.0, "sigma": 1.0}
    )
    for name in ("tb", "st_gfn"):
        state, history, visits = train_one(make_env(spec), spec, methods()[name], MODEL, TRAIN, seed=2, progress=False)
        l_state, l_history, l_visits, tracking = fit_one(
            spec,
            None,
            methods()[name],
            MODEL,
            dict(TRAIN, engine="lightning"),
            2,
            run_dir=tmp_path,
            name=f"{env_name}-{name}",
        )
        np.testing.assert_array_equal(history.loss, l_history.loss)
        pd.testing.assert_frame_equal(visits, l_visits)
        assert all(torch.equal(state[k], l_state[k]) for k in state) and "csv" in tracking


class Killed(Exception):
    """The job dies (its time limit, a preemption) in a training iteration."""


def _recorded_losses(monkeypatch, run_class) -> tuple[list[tuple[int, int]], dict[str, tuple[int, int] | None]]:
    """Patch `run_class.loss` to record the (seed, iteration) pairs it trains and to raise `Killed` at kill["at"]."""
    calls: list[tuple[int, int]] = []
    kill: dict[str, tuple[int, int] | None] = {"at": None}
    loss = run_class.loss

    def recorded(self, it):
        if (self.seed, it) == kill["at"]:
            raise Killed
        calls.append((self.seed, it))
        return loss(self, it)

    monkeypatch.setattr(run_class, "loss", recorded)
    return calls, kill


@pytest.mark.parametrize("env_name", ["hypergrid", "bitseq"])
def test_lightning_job_killed_mid_fit_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, env_name):
    """st_gfn_train at paper scale (train.py's loop over seeds, each fit_one in its folder of the job's
    checkpoint_dir()): a job killed in seed 1's iteration 7 (a checkpoint after every batch, mid-epoch), rerun,
    trains only seed 1's iterations 7-11 and ends with the weights, history (losses, betas) and visits of an
    uninterrupted run; a changed param gives another folder and trains everything afresh."""
    from types import SimpleNamespace

    from paperflow.core.resume import OWNER, checkpoint_dir
    from paperflow.st_gfn.lightning import FIT, RESULT, fit_one

    spec = (
        BITS
        if env_name == "bitseq"
        else {"kind": "hypergrid", "ndim": 2, "height": 8, "R0": 0.1, "R1": 0.5, "R2": 2.0, "sigma": 1.0}
    )
    method, seeds = methods()["st_gfn"], [0, 1]
    calls, kill = _recorded_losses(monkeypatch, TrainingRun)

    def job(train):
        return SimpleNamespace(rule="st_gfn_train", output=["m.pt"], input=[], params={"train": train})

    def train_seeds(train, folder):
        return {
            seed: fit_one(
                spec,
                None,
                method,
                MODEL,
                train,
                seed,
                run_dir=tmp_path / "run",
                name=f"seed{seed}",
                checkpoint_dir=None if folder is None else folder / f"seed{seed}",
                checkpoint_every_s=0.0,
            )
            for seed in seeds
        }

    train = dict(TRAIN, engine="lightning")
    clean = train_seeds(train, None)
    assert calls == [(s, i) for s in seeds for i in range(12)]

    folder = checkpoint_dir(job(train), root=tmp_path)
    calls.clear()
    kill["at"] = (1, 7)
    with pytest.raises(Killed):
        train_seeds(train, folder)
    assert (folder / "seed0" / RESULT).is_file() and not (folder / "seed0" / FIT).exists()
    assert (folder / "seed1" / FIT / "last.ckpt").is_file() and not (folder / "seed1" / RESULT).exists()

    calls.clear()
    kill["at"] = None
    resumed = train_seeds(train, folder)
    assert calls == [(1, i) for i in range(7, 12)]  # seed 0 loaded; seed 1 from the checkpoint after iteration 6
    for seed in seeds:
        state, history, visits, _ = clean[seed]
        r_state, r_history, r_visits, tracking = resumed[seed]
        pd.testing.assert_frame_equal(history, r_history)  # losses and the annealed betas
        pd.testing.assert_frame_equal(visits, r_visits)
        assert state.keys() == r_state.keys() and all(torch.equal(state[k], r_state[k]) for k in state)
        assert "csv" in tracking

    changed = dict(train, lr=2 * train["lr"])
    other = checkpoint_dir(job(changed), root=tmp_path)
    assert other != folder and (other / OWNER).is_file()
    calls.clear()
    train_seeds(changed, other)
    assert calls == [(s, i) for s in seeds for i in range(12)]


# --- the DAG end to end on the task envs (slow) ------------------------------------------------------------


@pytest.mark.slow
def test_task_envs_run_through_snakemake_with_a_pinned_http_download(repo_copy, norman_files, serve_folder):
    """The tiny DAG on `perturb` (GSE133344's format over loopback HTTP, pinned checksums) and `bits`, trained
    as Lightning jobs; the report carries their identities and reported directions, and the audit passes."""
    sha = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in norman_files.items()}
    path = repo_copy / "config" / "st_gfn.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["tiny"] = {
        "envs": {
            "bits": {k: BITS[k] for k in ("word_size", "seq_size", "n_modes", "mode_distance")},
            "perturb": {
                "base_url": serve_folder(norman_files["matrix"].parent),
                "sha256": sha,
                "min_cells": 10,
                "n_response_genes": 20,
                "n_modes": 3,
            },
        },
        "run_envs": ["perturb", "bits"],
        "seeds": [0, 1],
        "model": {"hidden": 16},
        "train": {"iterations": 30, "engine": "lightning"},
        "evaluate": {
            "last_visited": 240,
            "loss_window": 10,
            "n_eval_samples": 200,
            "efficiency_stride": 48,
            "top_k": 10,
        },
    }
    doc["defaults"]["env_methods"] = {"perturb": ["tb", "db", "st_gfn", "st_gfn_lam0"], "bits": ["tb", "st_gfn"]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_snakemake(
        repo_copy, "--cores", "2", "--config", "scale=tiny", "papers=[st_gfn]", "--", "results/tiny/st_gfn/report.md"
    )
    out = repo_copy / "results" / "tiny" / "st_gfn"
    claims = {c["id"]: c for c in json.loads((out / "metrics.json").read_text())["claims"]}
    assert {
        "identity_lam0_db_gap_bits",
        "identity_dc_tb_gap_perturb",
        "modes_found_st_gfn_vs_tb_bits",
        "topk_reward_st_gfn_vs_tb_bits",
    } <= set(claims)
    assert claims["identity_lam0_db_gap_bits"]["held"] and claims["identity_dc_tb_gap_perturb"]["held"]
    report = (out / "report.md").read_text()
    assert "Gene-set proxy" in report and "target double perturbation GENE4+GENE5" in report
    assert (repo_copy / "resources" / "st_gfn" / perturbation.FILES["matrix"]).is_file()
    assert any((out / "logs" / "train" / "bits_st_gfn").rglob("metrics.csv"))  # Lightning's CSV logger
    result = audit(out / "report.md")
    assert result.ok, result.problems
