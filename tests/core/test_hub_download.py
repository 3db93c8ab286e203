"""The one pinned download of a model repo (paperflow.core.hub_download.download_model) on the shared fake Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_hub import FakeHub, install

from paperflow.core import download
from paperflow.core.config import ConfigError
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub import snapshot_folder
from paperflow.core.hub_download import download_model

SHA = "a" * 40
REPO = {"config.json": "{}", "model.safetensors": b"w", "tokenizer.json": "{}", "README.md": "big", "extra.bin": b"x"}
SPEC = {"hub": "org/tiny", "repo_type": "model", "revision": SHA, "files": ["*.json", "*.safetensors"], "dtype": "x"}


@pytest.fixture
def hub(monkeypatch):
    fake = install(monkeypatch, FakeHub({"org/tiny": REPO}))
    monkeypatch.setattr(download, "read_lock_revisions", lambda slug, root=None: {})  # whatever the checkout holds
    return fake


def test_only_the_files_asked_are_fetched_into_the_snapshot_folder_and_the_json_names_them(hub, tmp_path):
    out = tmp_path / "models" / "pretrained.json"
    doc = download_model(SPEC, slug="p", key="pretrained.revision", cache=tmp_path / "cache", out=out)
    folder = snapshot_folder(tmp_path / "cache", "model", "org/tiny", SHA)
    assert doc == {"hub": "org/tiny", "revision": SHA, "folder": str(folder)}
    assert json.loads(out.read_text()) == doc and list(doc) == ["hub", "revision", "folder"]
    assert [(c["name"], c["revision"], c["patterns"]) for c in hub.calls] == [("org/tiny", SHA, SPEC["files"])]
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_extra_comes_first_in_the_json_and_an_offline_key_is_kept(hub, tmp_path):
    out = tmp_path / "m.json"
    doc = download_model({**SPEC, "offline": None}, slug="p", key="k", cache=tmp_path, out=out, extra={"role": "q"})
    assert list(doc) == ["role", "hub", "revision", "folder", "offline"] and doc["offline"] is None
    assert doc["role"] == "q" and json.loads(out.read_text()) == doc and len(hub.calls) == 1  # offline null: the Hub


def test_an_unpinned_revision_is_refused_naming_the_key_and_nothing_is_fetched(hub, tmp_path):
    out = tmp_path / "m.json"
    with pytest.raises(UnpinnedDownload, match=r"models\.policy\.revision is not set .*`paperflow pin p`"):
        download_model({**SPEC, "revision": None}, slug="p", key="models.policy.revision", cache=tmp_path, out=out)
    with pytest.raises(ConfigError, match=r"vlms\.x\.revision = 'main' .*not a pinned revision"):
        download_model({**SPEC, "revision": "main"}, slug="p", key="vlms.x.revision", cache=tmp_path, out=out)
    assert hub.calls == [] and not out.exists()


def test_an_offline_spec_is_materialised_from_its_package_beside_the_hub_folder(hub, tmp_path, monkeypatch):
    from paperflow.core.lm import models

    made = []

    def materialise(package, folder):
        made.append((package, Path(folder)))
        Path(folder).mkdir(parents=True)
        return Path(folder)

    monkeypatch.setattr(models, "materialise_gguf", materialise)
    out = tmp_path / "m.json"
    doc = download_model({**SPEC, "offline": "llm-x"}, slug="p", key="k", cache=tmp_path / "cache", out=out)
    assert made == [("llm-x", snapshot_folder(tmp_path / "cache", "model", "org/tiny-llm-x", SHA))]
    assert doc == {"hub": "org/tiny", "revision": SHA, "folder": str(made[0][1]), "offline": "llm-x"}
    assert json.loads(out.read_text()) == doc and hub.calls == []  # no network
