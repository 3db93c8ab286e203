"""Download (or generate) and preprocess mtbl_wc's problems; numpy only (no torch).

download: quadratic / concave -> the seeded instances; digits -> scikit-learn's bundled images;
mnist -> the pinned Keras mnist.npz. preprocess: per seed, the instance and its closed-form front
(synthetic), or the whitened features, seeded split and label noise (hyper-cleaning).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from paperflow.core.download import pinned_fetch
from paperflow.mtbl_wc import data, fronts
from paperflow.mtbl_wc.arrays import load_npz, save_npz

log = logging.getLogger(__name__)


def preference_matrix(r1: list[float]) -> np.ndarray:
    r = np.asarray(r1, dtype=float)
    return np.stack([r, 1.0 - r], axis=1)


def download(name: str, spec: dict[str, Any], seeds: list[int], cache_dir: str | Path, out: str | Path) -> None:
    kind = spec["kind"]
    if kind in ("quadratic", "concave"):
        make = fronts.quadratic_instance if kind == "quadratic" else fronts.concave_instance
        arrays = {f"seed{s}/{k}": v for s in seeds for k, v in make(spec["instance"], s).items()}
        save_npz(out, **arrays)
        log.info("generated %s instances for seeds %s", name, seeds)
        return
    if kind == "digits":
        pixels, labels = data.load_digits_arrays()
    else:
        path = pinned_fetch(spec["url"], Path(cache_dir) / Path(spec["url"]).name, spec["sha256"], slug="mtbl_wc",
                            key=f"problems.{name}.sha256")  # fmt: skip
        pixels, labels = data.load_mnist_npz(str(path))
    save_npz(out, pixels=pixels.astype(np.float32), labels=labels)
    log.info("%s: %d images with %d pixels", name, *pixels.shape)


def preprocess(name: str, spec: dict[str, Any], raw: str | Path, outs: Mapping[int, str], n_front: int) -> None:
    """Write the instance of each seed of `outs` ({seed: file})."""
    kind, arrays = spec["kind"], load_npz(raw)
    prefs = preference_matrix(spec["preferences"])
    if kind in ("quadratic", "concave"):
        front_of = fronts.quadratic_front if kind == "quadratic" else fronts.concave_front
        for seed, out in outs.items():
            inst = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"seed{seed}/")}
            save_npz(out, prefs=prefs, **inst, **front_of(inst, prefs, n_front))
        return
    inst = spec["instance"]
    feats = data.whitened_features(arrays["pixels"].astype(float), inst["zero_columns"], inst["n_components"])
    labels = arrays["labels"]
    for seed, out in outs.items():
        split = data.split_and_corrupt(labels, inst, seed)
        tr, va, te = split["train"], split["val"], split["test"]
        save_npz(
            out,
            prefs=prefs,
            phi_train=feats[tr],
            noisy_labels=split["noisy_labels"],
            true_train=labels[tr],
            flipped=split["flipped"],
            phi_val=feats[va],
            labels_val=labels[va],
            phi_test=feats[te],
            labels_test=labels[te],
            groups=np.asarray(inst["groups"]),
        )
        log.info(
            "%s seed %d: %d train (%d flipped) / %d val / %d test, %d features (rank %d)",
            name,
            seed,
            len(tr),
            int(split["flipped"].sum()),
            len(va),
            len(te),
            feats.shape[1],
            np.linalg.matrix_rank(feats[tr]),
        )
