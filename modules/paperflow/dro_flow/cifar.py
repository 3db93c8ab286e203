"""Paper-scale sources of the CIFAR-10 feature experiment (Sec. 6.3): the CIFAR-10 python tarball
and torchvision's ResNet-50 IMAGENET1K_V1 weights, fetched with a pinned sha256 (no torch here)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from paperflow.core.download import pinned_fetch

log = logging.getLogger(__name__)


def fetch_sources(spec: dict[str, Any], images_out: str | Path, weights_out: str | Path, key_prefix: str) -> None:
    """Both files, each verified against its pinned checksum; an unpinned one is refused naming its config key
    `<key_prefix>.<images|weights>_sha256` (e.g. datasets.cifar10.data.images_sha256) and `paperflow pin dro_flow`."""
    for url_key, sha_key, out in (
        ("images_url", "images_sha256", images_out),
        ("weights_url", "weights_sha256", weights_out),
    ):
        url, sha = spec[url_key], spec[sha_key]
        dest = Path(out).with_suffix(Path(out).suffix + ".download")
        path = pinned_fetch(url, dest, sha, slug="dro_flow", key=f"{key_prefix}.{sha_key}")
        shutil.move(str(path), out)
        log.info("fetched %s -> %s", url, out)
