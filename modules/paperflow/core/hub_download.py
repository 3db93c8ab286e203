"""A paper-scale download of a model repo at its pinned Hub commit, the one body behind every paper's download stage
(rules/scripts/download_model.py; rules/common.smk's `hub_model_stage` makes the stage).

Kept apart from `core.hub`, which the scripts of every scale import (a job's code hash covers each module its script
imports): only the download stages import this one, so changing it reruns only them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.hub import pinned_revision, snapshot_folder


def download_model(
    spec: Mapping[str, Any],
    *,
    slug: str,
    key: str,
    cache: str | Path,
    out: str | Path,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A model repo of paper `slug` at its pinned commit into the cache: only the files `spec["files"]` of Hub repo
    `spec["hub"]` at `spec["revision"]` (the config key `key`, named when it is unpinned; null: the lock file, see
    `pinned_revision`), into `snapshot_folder(cache, "model", hub, revision)`. Where the spec sets `offline` (a
    package that ships a GGUF copy of the model), that copy stands in for the Hub download (no network), dequantised
    into a folder beside the Hub one (`<hub>-<offline>`). `out` (JSON) holds `extra`, then hub, revision and folder
    (the folder every later rule loads offline), and offline where the spec has that key. Returns that document."""
    from paperflow.core.lm import models

    hub = spec["hub"]
    revision = pinned_revision(hub, spec["revision"], slug=slug, key=key, repo_type="model")
    offline = spec["offline"] if "offline" in spec else None
    if offline:
        folder = snapshot_folder(cache, "model", f"{hub}-{offline}", revision)
        models.materialise_gguf(offline, folder)  # written again each time: a folder cut off mid-write is not reused
    else:
        folder = snapshot_folder(cache, "model", hub, revision)
        models.download_pretrained(hub, revision, folder, allow_patterns=list(spec["files"]))
    doc = {**(extra or {}), "hub": hub, "revision": revision, "folder": str(folder)}
    if "offline" in spec:
        doc["offline"] = offline
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc
