"""Paper-scale downloads of the imaging experiment: the DiffUNet weights and the example image."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.download import fetch


class UnpinnedDownload(RuntimeError):
    """A download whose sha256 is not pinned in the config yet."""


def fetch_pinned(name: str, source: Mapping[str, Any], dest: str | Path) -> Path:
    if not source["sha256"]:
        raise UnpinnedDownload(
            f"imaging.{name}.sha256 is null in config/annealed_langevin.yaml, and paperflow does not download "
            f"unpinned files. On a machine with network: curl -L -o {Path(dest).name} '{source['url']}'; "
            f"sha256sum {Path(dest).name}; put the value in imaging.{name}.sha256 (see "
            "workflows/annealed_langevin/README.md, 'Imaging weights')."
        )
    return fetch(source["url"], dest, source["sha256"])
