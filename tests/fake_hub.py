"""The tests' one fake Hugging Face Hub (issue 55: nine paper-scale test files each had a copy).

`install(monkeypatch, hub)` puts a `FakeHub` in the place of `paperflow.core.lm.models.download_pretrained`, the one
function every pinned download of a model or dataset goes through, and clears the environment switch that allows
unpinned downloads. The fake checks the pin as the real function does, writes the repository's files that match
`allow_patterns` into the snapshot folder at their repository paths and records each call.

A repository is named in `repos` or taken from the `model` / `dataset` fallback for its repo_type. It is either
- a table `{path in the repository: payload}`, of which only the paths matching the patterns are written; a payload
  is bytes, text, a DataFrame (parquet, or JSON lines
  for a .jsonl path) or a list of dicts (written as JSON lines); or
- a folder (a whole snapshot, copied as is) or a callable that writes one into the folder it is given.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

Repo = Mapping[str, Any] | Path | str | Callable[[Path], None]


def write_payload(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    elif isinstance(payload, str):
        path.write_text(payload)
    elif isinstance(payload, pd.DataFrame) and path.suffix == ".jsonl":
        payload.to_json(path, orient="records", lines=True)
    elif isinstance(payload, pd.DataFrame):
        payload.to_parquet(path, index=False)
    elif isinstance(payload, list):
        path.write_text("".join(json.dumps(r) + "\n" for r in payload))
    else:
        raise TypeError(f"fake hub: cannot write a {type(payload).__name__} to {path.name}")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


class FakeHub:
    """`download_pretrained(name, revision, folder, allow_patterns=None, repo_type="model")` on the repositories
    given; `calls` holds one dict per call: name, revision, patterns, repo_type and the files written."""

    def __init__(
        self, repos: Mapping[str, Repo] | None = None, *, model: Repo | None = None, dataset: Repo | None = None
    ):
        self.repos = dict(repos or {})
        self.fallback = {"model": model, "dataset": dataset}
        self.calls: list[dict[str, Any]] = []

    def __call__(self, name, revision, folder, allow_patterns=None, repo_type="model"):
        from paperflow.core.lm import models

        models.require_pinned(name, revision)
        repo = self.repos.get(name, self.fallback.get(repo_type))
        if repo is None:
            raise FileNotFoundError(f"fake hub: no {repo_type} repository {name!r}")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(repo, Mapping):
            written = sorted(
                rel for rel in repo if allow_patterns is None or any(fnmatch.fnmatch(rel, p) for p in allow_patterns)
            )
            for rel in written:
                write_payload(folder / rel, repo[rel])
        else:
            if callable(repo):
                repo(folder)
            else:
                shutil.copytree(repo, folder, dirs_exist_ok=True)
            written = _files(folder)
        self.calls.append(
            {"name": name, "revision": revision, "patterns": allow_patterns, "repo_type": repo_type, "written": written}
        )
        return folder


def install(monkeypatch, hub: FakeHub) -> FakeHub:
    """`hub` in the place of the kit's download function for one test; unpinned downloads not allowed."""
    from paperflow.core.download import PIN_ENV
    from paperflow.core.lm import models

    monkeypatch.setattr(models, "download_pretrained", hub)
    monkeypatch.delenv(PIN_ENV, raising=False)
    return hub
