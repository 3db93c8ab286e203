"""Pinned downloads: the sha256 from the config, else from the paper's lock file; `paperflow pin <slug>` fetches
the unpinned files once and writes their sha256; an unpinned file is refused with that command named; a file that
changed on the server after pinning is refused. Unit tests of `pinned_fetch`, then the real CLI and Snakemake on a
paper (mtbl_wc's MNIST) against a loopback server."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import copy_repo, run_snakemake

from paperflow.core.config import ConfigError
from paperflow.core.download import PIN_ENV, ChecksumMismatch, UnpinnedDownload, lock_path, pinned_fetch, read_lock


@pytest.fixture
def server(serve_bytes):
    """A loopback server whose payload the test may change: returns (url, state dict with 'payload')."""
    state = {"payload": b"first version\n"}
    base, _ = serve_bytes(state)
    return f"{base}/data/file.bin", state


def test_unpinned_is_refused_with_the_pin_command_named(server, tmp_path, monkeypatch):
    url, _ = server
    monkeypatch.delenv(PIN_ENV, raising=False)
    with pytest.raises(
        UnpinnedDownload,
        match=r"datasets\.x\.sha256 is not set and config/locks/demo\.json has no sha256 for .*`paperflow pin demo`",
    ):
        pinned_fetch(url, tmp_path / "f.bin", None, slug="demo", key="datasets.x.sha256", root=tmp_path)
    assert not (tmp_path / "f.bin").exists()
    assert issubclass(UnpinnedDownload, ConfigError)  # a config problem, reported like the others


def test_pin_writes_the_lock_then_verifies_and_refuses_a_changed_file(server, tmp_path, monkeypatch):
    url, state = server
    monkeypatch.setenv(PIN_ENV, "other,demo")
    got = pinned_fetch(url, tmp_path / "a" / "f.bin", None, slug="demo", key="k", root=tmp_path, progress=False)
    assert got.read_bytes() == state["payload"]
    entry = read_lock("demo", tmp_path)[url]
    assert entry["sha256"] == hashlib.sha256(state["payload"]).hexdigest() and entry["bytes"] == len(state["payload"])
    assert json.loads(lock_path("demo", tmp_path).read_text())["files"][url] == entry
    monkeypatch.delenv(PIN_ENV)
    # a later run verifies against the lock
    again = pinned_fetch(url, tmp_path / "b" / "f.bin", None, slug="demo", key="k", root=tmp_path, progress=False)
    assert again.read_bytes() == state["payload"]
    # the file changes on the server: refused, and pinning again does not overwrite the pin
    state["payload"] = b"second version\n"
    for env in (None, "demo"):
        if env:
            monkeypatch.setenv(PIN_ENV, env)
        with pytest.raises(ChecksumMismatch):
            pinned_fetch(url, tmp_path / "c" / "f.bin", None, slug="demo", key="k", root=tmp_path, progress=False)
    assert read_lock("demo", tmp_path)[url] == entry


def test_a_checksum_in_the_config_wins_over_the_lock(server, tmp_path, monkeypatch):
    url, state = server
    monkeypatch.delenv(PIN_ENV, raising=False)
    lock = lock_path("demo", tmp_path)
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"files": {url: {"sha256": "0" * 64}}}))
    right = hashlib.sha256(state["payload"]).hexdigest()
    assert pinned_fetch(url, tmp_path / "f.bin", right, slug="demo", key="k", root=tmp_path, progress=False).is_file()
    with pytest.raises(ChecksumMismatch):
        pinned_fetch(url, tmp_path / "g.bin", None, slug="demo", key="k", root=tmp_path, progress=False)


def _mnist_like(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    np.savez(
        buf,
        x_train=rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, 12, dtype=np.uint8),
        x_test=rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, 4, dtype=np.uint8),
    )
    return buf.getvalue()


@pytest.mark.slow
def test_paperflow_pin_end_to_end_on_a_paper(server, tmp_path):
    """mtbl_wc's MNIST at paper scale, its checksum removed and its URL on loopback: the download rule refuses it
    naming the command; `paperflow pin mtbl_wc` writes config/locks/mtbl_wc.json; a fresh run verifies against
    it; after the file changes on the server the run is refused."""
    url, state = server
    state["payload"] = _mnist_like(0)
    repo = copy_repo(tmp_path / "repo")
    cfg_path = repo / "config" / "mtbl_wc.yaml"
    doc = yaml.safe_load(cfg_path.read_text())
    doc["defaults"]["problems"]["mnist"].update(url=url, sha256=None)
    assert "mnist" in doc["paper"]["run_problems"]  # the paper's problems: its gated claims need every one
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    args = ("--cores", "1", "--config", "scale=paper", "papers=[mtbl_wc]", "--until", "mtbl_wc_download")
    refused = run_snakemake(repo, *args, check=False)
    assert refused.returncode != 0
    assert "`paperflow pin mtbl_wc`" in refused.stdout + refused.stderr

    env = {k: v for k, v in os.environ.items() if k != PIN_ENV}
    env["PYTHONPATH"] = str(repo / "modules")
    pin = subprocess.run(
        [sys.executable, "-m", "paperflow.core.cli", "pin", "mtbl_wc", "--cores", "1"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pin.returncode == 0, pin.stdout[-3000:] + pin.stderr[-3000:]
    lock = json.loads((repo / "config" / "locks" / "mtbl_wc.json").read_text())["files"]
    assert lock[url]["sha256"] == hashlib.sha256(state["payload"]).hexdigest()

    def fresh_run(check=True):
        for folder in (repo / "results" / "paper" / "mtbl_wc" / "raw", repo / "resources" / "mtbl_wc"):
            for f in folder.glob("*") if folder.is_dir() else []:
                f.unlink()
        return run_snakemake(repo, *args, check=check)

    fresh_run()
    assert (repo / "results" / "paper" / "mtbl_wc" / "raw" / "mnist.npz").is_file()
    state["payload"] = _mnist_like(1)
    changed = fresh_run(check=False)
    assert changed.returncode != 0
    assert "sha256 mismatch" in changed.stdout + changed.stderr


# Hub repos (models, datasets): a 40-hex commit from the config or the lock; `paperflow pin` resolves the head
SHA_A, SHA_B = "a" * 40, "b" * 40


def test_hub_revision_from_the_config_then_the_lock_and_a_branch_is_refused(tmp_path, monkeypatch):
    from paperflow.core.hub import pinned_revision

    monkeypatch.delenv(PIN_ENV, raising=False)
    assert pinned_revision("org/m", SHA_A, slug="demo", key="model.revision", root=tmp_path) == SHA_A
    with pytest.raises(ConfigError, match=r"model\.revision = 'main' for model 'org/m' is not a pinned revision"):
        pinned_revision("org/m", "main", slug="demo", key="model.revision", root=tmp_path)
    with pytest.raises(UnpinnedDownload, match=r"no revision for dataset:org/d: .*`paperflow pin demo`"):
        pinned_revision("org/d", None, slug="demo", key="data.revision", repo_type="dataset", root=tmp_path)
    with pytest.raises(ValueError, match="repo_type"):
        pinned_revision("org/d", None, slug="demo", key="data.revision", repo_type="space", root=tmp_path)


def test_pin_resolves_the_hub_head_once_and_keeps_the_files_section(server, tmp_path, monkeypatch):
    import huggingface_hub

    from paperflow.core.download import read_lock_revisions
    from paperflow.core.hub import pinned_revision

    url, _ = server
    heads = {"org/m": SHA_A}
    asked = []

    def repo_info(self, repo_id, repo_type=None):
        asked.append((repo_id, repo_type))
        return type("Info", (), {"sha": heads[repo_id]})()

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", repo_info)
    monkeypatch.setenv(PIN_ENV, "demo")
    pinned_fetch(url, tmp_path / "f.bin", None, slug="demo", key="datasets.x.sha256", root=tmp_path)
    assert pinned_revision("org/m", None, slug="demo", key="model.revision", root=tmp_path) == SHA_A
    heads["org/m"] = SHA_B  # the branch moves on the Hub: the pin stays
    assert pinned_revision("org/m", None, slug="demo", key="model.revision", root=tmp_path) == SHA_A
    assert asked == [("org/m", "model")]
    assert read_lock_revisions("demo", tmp_path)["model:org/m"]["revision"] == SHA_A
    assert url in read_lock("demo", tmp_path)  # the file pinned before is still there
    monkeypatch.delenv(PIN_ENV)
    assert pinned_revision("org/m", None, slug="demo", key="model.revision", root=tmp_path) == SHA_A


def test_plan_counts_a_hub_reference_without_revision_until_the_lock_holds_it():
    from paperflow.core.plan import unpinned_downloads

    cfg = {
        "model": {"hub": "org/m", "revision": None},
        "data": {"hub": "org/d", "repo_type": "dataset", "revision": SHA_A},
    }
    assert unpinned_downloads(cfg, {}) == ["model.revision"]
    assert unpinned_downloads(cfg, {}, revisions={"model:org/m": {"revision": SHA_B}}) == []
    assert unpinned_downloads(cfg, {}, revisions={"dataset:org/m": {"revision": SHA_B}}) == ["model.revision"]


def test_concurrent_lock_writes_keep_every_entry(tmp_path):
    """Two download jobs of one `paperflow pin` run write the lock at once: no entry may be lost."""
    from concurrent.futures import ProcessPoolExecutor

    urls = [f"http://h/{i}.bin" for i in range(40)]
    with ProcessPoolExecutor(4) as pool:
        list(pool.map(_write_one, [(str(tmp_path), u) for u in urls]))
    assert sorted(read_lock("demo", tmp_path)) == sorted(urls)


def _write_one(args):
    from paperflow.core.download import _write_lock_entry

    root, url = args
    _write_lock_entry("demo", url, {"sha256": "0" * 64, "bytes": 1, "pinned_utc": "t"}, root)


def test_a_hub_snapshot_folder_is_one_per_repo_and_pinned_commit(tmp_path):
    from paperflow.core.hub import snapshot_folder

    sha, other = "0" * 39 + "1", "f" * 40
    folder = snapshot_folder(tmp_path, "dataset", "org/name", sha)
    assert folder == tmp_path / "datasets" / "org--name" / sha
    assert (
        snapshot_folder(tmp_path, "model", "org/name", sha)
        != folder
        != snapshot_folder(tmp_path, "dataset", "org/name", other)
    )
    with pytest.raises(ValueError, match="'main' of 'org/name' is not a 40-hex commit"):
        snapshot_folder(tmp_path, "model", "org/name", "main")
    with pytest.raises(ValueError, match="repo_type 'space'"):
        snapshot_folder(tmp_path, "space", "org/name", sha)
