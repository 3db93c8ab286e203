"""Hugging Face Hub repos (models, datasets) named at a pinned commit, the way `core.download` pins files.

Kept apart from `core.download` so that only the rules that name Hub repos import `huggingface_hub` (and their
envs carry it); the lock file (config/locks/<slug>.json, its `revisions` section) is the same one.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import UTC
from pathlib import Path

from paperflow.core.config import ConfigError
from paperflow.core.download import PIN_ENV, UnpinnedDownload, _write_lock, lock_path, read_lock_revisions

log = logging.getLogger("paperflow.download")

HUB_REVISION = re.compile(r"^[0-9a-f]{40}$")
HUB_REPO_TYPES = ("model", "dataset")


def snapshot_folder(cache: str | Path, repo_type: str, repo_id: str, revision: str) -> Path:
    """Where a paper-scale download keeps Hub repo `repo_id` at `revision`: `<cache>/<repo_type>s/<owner>--<name>/
    <revision>`, one folder per pinned commit, so a new pin never mixes files with an old one."""
    if repo_type not in HUB_REPO_TYPES:
        raise ValueError(f"repo_type {repo_type!r} not in {HUB_REPO_TYPES}")
    if not HUB_REVISION.match(str(revision)):
        raise ValueError(f"revision {revision!r} of {repo_id!r} is not a 40-hex commit")
    return Path(cache) / f"{repo_type}s" / repo_id.replace("/", "--") / str(revision)


def pinned_revision(
    repo_id: str,
    revision: str | None,
    *,
    slug: str,
    key: str,
    repo_type: str = "model",
    root: str | Path | None = None,
) -> str:
    """The 40-hex commit of Hugging Face Hub repo `repo_id` that a paper-scale download uses: the config's
    `revision` (named `key` there), else the one the paper's lock file holds. Neither: under `paperflow pin`
    (PAPERFLOW_PIN naming the slug) the repo's current head commit is resolved with huggingface_hub and written to
    the lock file; otherwise UnpinnedDownload names that command. A branch or tag (which moves) is refused."""
    if repo_type not in HUB_REPO_TYPES:
        raise ValueError(f"repo_type {repo_type!r} not in {HUB_REPO_TYPES}")
    if revision is not None:
        if not HUB_REVISION.match(str(revision)):
            raise ConfigError(
                f"{key} = {revision!r} for {repo_type} {repo_id!r} is not a pinned revision: give the 40-hex commit sha "
                "(the Hub page's 'Files and versions' history), not a branch or tag, or null to use the lock file"
            )
        return str(revision)
    ref = f"{repo_type}:{repo_id}"
    locked = read_lock_revisions(slug, root).get(ref)
    if locked:
        return locked["revision"]
    if slug in {s.strip() for s in os.environ.get(PIN_ENV, "").split(",")}:
        from datetime import datetime

        from huggingface_hub import HfApi

        info = HfApi().repo_info(repo_id, repo_type=repo_type)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _write_lock(slug, root, revisions={ref: {"revision": info.sha, "pinned_utc": stamp}})
        log.info("pinned %s at %s in %s", ref, info.sha, lock_path(slug, root))
        return info.sha
    raise UnpinnedDownload(
        f"{key} is not set and config/locks/{slug}.json has no revision for {ref}: paperflow never downloads a Hub "
        f"repo at a moving branch. On a machine with network, run `paperflow pin {slug}` once (it resolves the "
        f"current commit and writes config/locks/{slug}.json; commit that file), or set {key} in "
        f"config/{slug}.yaml to the 40-hex commit sha"
    )
