"""Download (or generate) and preprocess the three experiments; splits go to one long Parquet table
(columns seed, part, optional u / label / group, x0..x{D-1}) and the calibrated bulks to JSON.

tiny/smoke: seeded generators (newsvendor, synthetic geographic regression, template comments).
paper: California Housing (StatLib archive, sha256 pinned from scikit-learn's own metadata) and
CivilComments (WILDS v1.0 archive; sha256 not published, so the download fails with instructions).
"""

from __future__ import annotations

import json
import logging
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA

from paperflow.core.download import pinned_fetch
from paperflow.core.io import read_frame, write_frame
from paperflow.credal_dro import newsvendor as nv
from paperflow.credal_dro import regression as rg
from paperflow.credal_dro import text
from paperflow.credal_dro.bulk import Bulk, calibrate
from paperflow.credal_dro.tables import features

log = logging.getLogger(__name__)
CONTAMINATION_SEED_OFFSET = 10_000


def _fetch(spec: Mapping[str, Any], cache: str | Path, name: str) -> Path:
    return pinned_fetch(spec["url"], Path(cache) / spec["filename"], spec["sha256"], slug="credal_dro",
                        key=f"{name}.sha256")  # fmt: skip


def download(exp: str, cfg: Mapping[str, Any], seeds: Sequence[int], cache: str | Path, out: str | Path) -> dict:
    """Raw data of one experiment as a frame; returns the metadata written with it."""
    if exp == "newsvendor":
        n = cfg["n_fit"] + cfg["m_select"] + cfg["n_test"]
        parts = np.repeat(["fit", "select", "test"], [cfg["n_fit"], cfg["m_select"], cfg["n_test"]])
        frames = [
            pd.DataFrame(
                nv.demand(n, cfg["demand"], np.random.default_rng(s)),
                columns=[f"x{j}" for j in range(cfg["demand"]["dim"])],
            ).assign(seed=s, part=parts)
            for s in seeds
        ]
        frame, meta = pd.concat(frames, ignore_index=True), {"source": "generator", "demand": dict(cfg["demand"])}
    elif exp == "regression":
        if cfg["source"] == "california":
            frame = rg.read_california(_fetch(cfg["california"], cache, "regression.california"))
        else:
            syn = cfg["synthetic"]
            frame = rg.synthetic_geo(
                syn["n"], syn["dim"], syn["drift"], syn["df"], np.random.default_rng(syn["data_seed"])
            )
        meta = {"source": cfg["source"]}
    elif exp == "text":
        if cfg["source"] == "civilcomments":
            archive = _fetch(cfg["civilcomments"], cache, "text.civilcomments")
            with tarfile.open(archive) as tar:
                tar.extractall(Path(cache) / "civilcomments", filter="data")
            frame = text.read_civilcomments(
                str(next((Path(cache) / "civilcomments").rglob("all_data_with_identities.csv")))
            )
        else:
            syn = cfg["synthetic"]
            rng = np.random.default_rng(syn["data_seed"])
            parts = {"train": (syn["n_train"], True), "val": (syn["n_val"], True), "test": (syn["n_test"], False)}
            frame = pd.concat(
                [
                    text.synthetic_comments(n, syn["ambiguous"], syn["spurious"], rng, corr).assign(split=p)
                    for p, (n, corr) in parts.items()
                ],
                ignore_index=True,
            )
        meta = {"source": cfg["source"]}
    else:
        raise ValueError(f"unknown experiment {exp!r}")
    write_frame(out, frame, meta)
    log.info("%s: %d raw rows (%s)", exp, len(frame), meta["source"])
    return meta


def _long(
    parts: Mapping[str, np.ndarray], seed: int, extra: Mapping[str, Mapping[str, np.ndarray]] | None = None
) -> pd.DataFrame:
    frames = []
    for part, x in parts.items():
        f = pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])]).assign(seed=seed, part=part)
        for col, values in (extra or {}).get(part, {}).items():
            f[col] = values
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def preprocess(
    exp: str,
    raw: str | Path,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    splits_out: str | Path,
    bulks_out: str | Path,
) -> None:
    """Per seed: the splits and the bulk calibrated on (fit, select); newsvendor also gets its
    contaminated test draws (in-bulk spikes, which need the calibrated box)."""
    frame, _ = read_frame(raw)
    bcfg = cfg["bulk"]
    frames, bulks = [], {}
    for seed in seeds:
        if exp == "newsvendor":
            own = frame[frame.seed == seed]
            parts = {
                p: own[own.part == p][[c for c in own.columns if c.startswith("x")]].to_numpy()
                for p in ("fit", "select", "test")
            }
            d = parts["fit"].shape[1]
            bulk = calibrate(
                parts["fit"],
                parts["select"],
                [(bcfg["geometry"], range(d))],
                bcfg["gamma"],
                bcfg["delta"],
                bcfg["box_quantile"],
            )
            c = cfg["contamination"]
            parts["test_contaminated"] = nv.contaminate(
                parts["test"],
                bulk,
                c["frac"],
                tuple(c["spike"]),
                np.random.default_rng(CONTAMINATION_SEED_OFFSET + seed),
            )
            frames.append(_long(parts, seed))
        elif exp == "regression":
            sp = rg.geo_split(frame, seed, cfg["split"]["train_frac"], cfg["split"]["gap"], cfg["split"]["select_frac"])
            d = sp["fit"].shape[1] - 1
            bulk = calibrate(
                sp["fit"],
                sp["select"],
                [("ellipsoid", range(d)), ("box", [d])],
                bcfg["gamma"],
                bcfg["delta"],
                bcfg["box_quantile"],
            )
            frames.append(
                _long(
                    {p: sp[p] for p in ("fit", "select", "test")},
                    seed,
                    {"select": {"u": sp["u_select"]}, "test": {"u": sp["u_test"]}},
                )
            )
        else:
            bulk, part_frames = _text_split(frame, cfg, seed)
            frames.append(part_frames)
        bulks[str(seed)] = bulk.to_json()
        log.info("%s seed %d: bulk certificate %s", exp, seed, bulk.certificate)
    write_frame(splits_out, pd.concat(frames, ignore_index=True), {"experiment": exp})
    Path(bulks_out).write_text(json.dumps(bulks, indent=1))


def _text_split(frame: pd.DataFrame, cfg: Mapping[str, Any], seed: int) -> tuple[Bulk, pd.DataFrame]:
    """WILDS splits; the training split is cut into fit / select (the bulk's DKW split) by the seed;
    PCA to `pca_dim` fitted on the fit split; X-ellipsoid bulk."""
    x_all = features(frame)
    train = np.flatnonzero(frame["split"].to_numpy() == "train")
    train = np.random.default_rng(seed).permutation(train)
    n_sel = int(round(cfg["select_frac"] * len(train)))
    idx = {"fit": train[n_sel:], "select": train[:n_sel], "test": np.flatnonzero(frame["split"].to_numpy() == "test")}
    pca = PCA(n_components=cfg["pca_dim"], random_state=seed).fit(x_all[idx["fit"]])
    parts = {p: pca.transform(x_all[i]) for p, i in idx.items()}
    bcfg = cfg["bulk"]
    bulk = calibrate(
        parts["fit"], parts["select"], [("ellipsoid", range(cfg["pca_dim"]))], bcfg["gamma"], bcfg["delta"], None
    )
    extra = {p: {"label": frame["label"].to_numpy()[i], "group": frame["group"].to_numpy()[i]} for p, i in idx.items()}
    return bulk, _long(parts, seed, extra)
