"""Preprocess: the exact target pi = R / Z of enumerable envs, the reference modes of sequence envs, the
reference positions of games (optimal moves by the exact oracle or solver)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.st_gfn import perturbation
from paperflow.st_gfn.settings import GAMES


def target(raw: pd.DataFrame, spec: Mapping[str, Any]) -> pd.DataFrame:
    """HyperGrid: pi = R / Z by enumeration; modes are the states with R >= R0 + R1 + R2 (spec section 8)."""
    frame = raw.sort_values("state").reset_index(drop=True)
    frame["pi"] = frame["reward"] / frame["reward"].sum()
    frame["is_mode"] = frame["reward"] >= (spec["R0"] + spec["R1"] + spec["R2"]) * (1 - 1e-6)  # float32 rewards
    return frame


def preprocess(raw_path: str, spec: Mapping[str, Any], out: str) -> None:
    raw, meta = read_frame(raw_path)
    kind = spec["kind"]
    if kind == "hypergrid":
        write_frame(out, target(raw, spec), meta)
    elif kind == "bitseq":  # the reference modes are the target
        write_frame(out, raw, meta)
    elif kind == "geneset":
        frame, proxy = perturbation.target(raw, spec)
        write_frame(out, frame, dict(meta, proxy=proxy))
    elif kind in GAMES:  # the tic-tac-toe oracle or the solved Connect-4 test set
        from paperflow.st_gfn.games import reference_positions  # torch: imported only for the games

        frame, about = reference_positions(spec)
        write_frame(out, frame, dict(meta, **about))
    else:
        raise ValueError(f"unknown env kind {kind!r}")
