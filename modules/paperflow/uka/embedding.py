"""uka's preprocess stage: every situation text and every (situation, need) text embedded once, by MiniLM through
the kit's shared loader or by the hashed bag-of-words fallback (its own module: only this stage needs the
sentence-encoder stack)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.io import write_frame
from paperflow.uka import needworld as nw
from paperflow.uka.memory import hashed_embedding


def embed(embedding: Mapping[str, Any], out: str) -> pd.DataFrame:
    """Every situation text and every (situation, need) text embedded once: MiniLM (the kit's shared loader) or
    the hashed bag-of-words fallback, as the config says."""
    rows = []
    for kind, texts in (("situation", nw.situation_texts()), ("keyed", nw.keyed_texts())):
        if embedding["kind"] == "minilm":
            from paperflow.core.lm.encoders import encode_sentences

            vectors = encode_sentences(texts, batch_size=int(embedding["batch_size"]), progress=True)
        else:
            vectors = hashed_embedding(texts)
        rows.append(pd.DataFrame({"kind": kind, "row": np.arange(len(texts)), "text": texts, "vector": list(vectors)}))
    frame = pd.concat(rows, ignore_index=True)
    write_frame(out, frame, {"encoder": embedding["kind"], "version": nw.VERSION})
    return frame
