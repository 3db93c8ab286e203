"""Paper-scale sources of the CIFAR-10 feature experiment (Sec. 6.3): the CIFAR-10 python tarball
and torchvision's ResNet-50 IMAGENET1K_V1 weights, fetched with a pinned sha256 (no torch here)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.download import fetch

log = logging.getLogger(__name__)


def fetch_sources(spec: dict[str, Any], images_out: str | Path, weights_out: str | Path) -> None:
    for url_key, sha_key, out in (
        ("images_url", "images_sha256", images_out),
        ("weights_url", "weights_sha256", weights_out),
    ):
        url, sha = spec[url_key], spec[sha_key]
        if not sha:
            raise ConfigError(
                f"data.{sha_key} is not set for {url}: paperflow never downloads unpinned data. Fetch the file once on a "
                f"machine with network, run `sha256sum` on it, and set data.{sha_key} in config/dro_flow.yaml "
                "(see workflows/dro_flow/README.md, 'CIFAR-10 at paper scale')"
            )
        path = fetch(url, Path(out).with_suffix(Path(out).suffix + ".download"), sha)
        shutil.move(str(path), out)
        log.info("fetched %s -> %s", url, out)
