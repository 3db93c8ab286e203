"""Paper-scale downloads of the imaging experiment: the DiffUNet weights and the example image."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.download import pinned_fetch


def fetch_pinned(name: str, source: Mapping[str, Any], dest: str | Path) -> Path:
    """The imaging file `name` (weights or image), verified against imaging.<name>.sha256 or the paper's lock file;
    an unpinned one is refused naming `paperflow pin annealed_langevin` (core.download.pinned_fetch)."""
    return pinned_fetch(source["url"], dest, source["sha256"], slug="annealed_langevin", key=f"imaging.{name}.sha256")
