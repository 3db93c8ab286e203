"""What the download rule writes for each env kind (spec section 6, `download_{dataset}`): the enumerated
HyperGrid states, torchgfn's BitSequence reference modes, the pseudobulk counts of the perturbation
data (the real GSE133344 files at paper scale, fetched with pinned checksums), or a game's rules (the
games need no data: spec section 4)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.io import write_frame
from paperflow.st_gfn import perturbation
from paperflow.st_gfn.envs import enumerate_states, make_env
from paperflow.st_gfn.games import GAME_KINDS, make_game
from paperflow.st_gfn.sequences import reference_modes

log = logging.getLogger(__name__)


def download(name: str, spec: Mapping[str, Any], cache_dir: str | Path, out: str | Path) -> None:
    kind = spec["kind"]
    if kind == "hypergrid":
        frame, source = enumerate_states(spec), "torchgfn HyperGrid (enumerated, no download)"
    elif kind == "bitseq":
        frame, source = reference_modes(make_env(spec)), "torchgfn BitSequence reference modes (no download)"
    elif kind == "geneset":
        files = perturbation.acquire(name, spec, cache_dir)
        frame = perturbation.pseudobulk(files)
        source = {key: str(path) for key, path in files.items()}
    elif kind in GAME_KINDS:
        game = make_game(spec)
        frame = pd.DataFrame(
            [
                {
                    "game": game.name,
                    "rows": game.rows,
                    "cols": game.cols,
                    "connect": game.connect,
                    "gravity": game.gravity,
                }
            ]
        )
        source = "game rules (no download)"
    else:
        raise ValueError(f"unknown env kind {kind!r}")
    log.info("%s: %d rows from %s", name, len(frame), source)
    write_frame(out, frame, {"env": name, "spec": dict(spec), "source": source})
