"""What the download rule writes for each env kind (spec section 6, `download_{dataset}`): the enumerated
HyperGrid states, torchgfn's BitSequence reference modes, or the pseudobulk counts of the perturbation
data (the real GSE133344 files at paper scale, fetched with pinned checksums)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from paperflow.core.io import write_frame
from paperflow.st_gfn import perturbation
from paperflow.st_gfn.envs import enumerate_states, make_env
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
    else:
        raise ValueError(f"unknown env kind {kind!r}")
    log.info("%s: %d rows from %s", name, len(frame), source)
    write_frame(out, frame, {"env": name, "spec": dict(spec), "source": source})
