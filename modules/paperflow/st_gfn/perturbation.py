"""Single-cell perturbation task (spec section 4): choose a set of k genes to activate so that the predicted
transcriptional response matches a target response. [R]: the paper's dataset and reward proxy are unknown;
this is the spec's most likely dataset (Norman et al. 2019, K562 CRISPRa Perturb-seq, GEO GSE133344) with
a reconstructed proxy.

Data: GEO GSE133344's filtered 10x files (Matrix Market genes x cells, genes, barcodes, and the cell
identities CSV whose `guide_identity` is `A_B__A_B`, `NegCtrl*` marking a control guide). `pseudobulk`
streams the matrix once and sums the counts of each perturbation condition ("ctrl", "A", "A+B").

Proxy [R]: profiles are log1p counts per 10^4 of each pseudobulk; shift(c) = profile(c) - profile(ctrl) on
`n_response_genes` response genes (the genes whose single-perturbation shifts vary most, the perturbed
genes themselves left out). The response of a gene set S is additive, shift(S) = sum_{g in S} shift(g)
(the no-interaction model of Norman et al.), the target is the measured shift of one double perturbation,
and log R(S) = -||shift(S) - target||^2 / (tau ||target||^2). Objects are the C(G, k) sets of the G genes
with a single perturbation of at least `min_cells` cells, so pi = R / Z is exact by enumeration. The
environment (`envs.make_geneset`) is torchgfn's `SetAddition` (fixed length k) with this reward. This
module needs no torch (the preprocess rule runs without it).

At tiny scale `synthetic_norman` writes the same four files from a seeded generator (no network).
"""

from __future__ import annotations

import gzip
import itertools
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from paperflow.core.config import ConfigError
from paperflow.core.download import pinned_fetch

log = logging.getLogger(__name__)

FILES = {
    "matrix": "GSE133344_filtered_matrix.mtx.gz",
    "genes": "GSE133344_filtered_genes.tsv.gz",
    "barcodes": "GSE133344_filtered_barcodes.tsv.gz",
    "identities": "GSE133344_filtered_cell_identities.csv.gz",
}
CONTROL = "ctrl"
LOG_REWARD_FLOOR = -80.0  # exp(-80) ~ 1.8e-35 stays a positive float32 reward


# --- the files ----------------------------------------------------------------------------------------


def acquire(name: str, spec: Mapping[str, Any], cache_dir: str | Path) -> dict[str, Path]:
    """The four GSE133344 files, fetched with their pinned sha256 (or written by the seeded generator)."""
    cache = Path(cache_dir)
    if spec["source"] == "synthetic_norman":
        return write_synthetic_norman(cache / "synthetic_norman", int(spec["synthetic_seed"]))
    if spec["source"] != "geo":
        raise ConfigError(f"envs.{name}.source = {spec['source']!r} is not known; known: geo, synthetic_norman")
    return {
        key: pinned_fetch(
            spec["base_url"] + FILES[key],
            cache / FILES[key],
            spec["sha256"].get(key),
            slug="st_gfn",
            key=f"envs.{name}.sha256.{key}",
        )  # fmt: skip
        for key in FILES
    }


def condition_of(guide_identity: str) -> str:
    """'A_B__A_B' -> 'A+B' (genes sorted), 'A_NegCtrl0__A_NegCtrl0' -> 'A', only NegCtrl guides -> 'ctrl'."""
    genes = sorted({g for g in guide_identity.split("__")[0].split("_") if g and not g.startswith("NegCtrl")})
    return "+".join(genes) if genes else CONTROL


def read_identities(path: str | Path) -> pd.DataFrame:
    """cell_barcode -> condition, from GSE133344's cell identities CSV."""
    frame = pd.read_csv(path, usecols=["cell_barcode", "guide_identity"])
    frame["condition"] = frame["guide_identity"].map(condition_of)
    return frame[["cell_barcode", "condition"]]


def read_mtx_header(handle) -> tuple[int, int, int, int]:
    """(rows, cols, entries, header lines) of a coordinate Matrix Market file."""
    first = handle.readline()
    if not first.startswith("%%MatrixMarket matrix coordinate"):
        raise ValueError(f"not a coordinate Matrix Market file (first line {first.strip()!r})")
    lines = 1
    for line in handle:
        lines += 1
        if not line.startswith("%"):
            rows, cols, entries = map(int, line.split())
            return rows, cols, entries, lines
    raise ValueError("Matrix Market file has no size line")


def pseudobulk(files: Mapping[str, Path], chunk_entries: int = 5_000_000, progress: bool = True) -> pd.DataFrame:
    """Summed counts per condition (rows) and gene symbol (columns), plus `n_cells`, streaming the genes x cells
    matrix once; cells without an identity are left out."""
    genes = pd.read_csv(files["genes"], sep="\t", header=None).iloc[:, 1].astype(str).to_numpy()
    barcodes = pd.read_csv(files["barcodes"], sep="\t", header=None).iloc[:, 0].astype(str).to_numpy()
    identity = read_identities(files["identities"]).set_index("cell_barcode")["condition"]
    if identity.index.has_duplicates:
        raise ValueError(
            f"{files['identities']}: cell barcodes listed more than once, e.g. "
            f"{identity.index[identity.index.duplicated()][0]!r}"
        )
    conditions = np.array(sorted(identity.unique()))
    code = {c: i for i, c in enumerate(conditions)}
    cell_condition = np.array([code.get(identity.get(b), -1) for b in barcodes], dtype=np.int64)
    with gzip.open(files["matrix"], "rt") as handle:
        n_rows, n_cols, entries, skip = read_mtx_header(handle)
    if (n_rows, n_cols) != (len(genes), len(barcodes)):
        raise ValueError(f"matrix is {n_rows} x {n_cols} but there are {len(genes)} genes and {len(barcodes)} barcodes")
    sums = np.zeros(len(conditions) * n_rows)
    reader = pd.read_csv(
        files["matrix"],
        sep=" ",
        header=None,
        skiprows=skip,
        names=["gene", "cell", "count"],
        dtype={"gene": np.int64, "cell": np.int64, "count": np.float64},
        chunksize=chunk_entries,
    )
    with tqdm(total=entries, desc="pseudobulk", unit="entry", disable=not progress, mininterval=10) as bar:
        for chunk in reader:
            cond = cell_condition[chunk["cell"].to_numpy() - 1]
            keep = cond >= 0
            flat = cond[keep] * n_rows + chunk["gene"].to_numpy()[keep] - 1
            sums += np.bincount(flat, weights=chunk["count"].to_numpy()[keep], minlength=sums.size)
            bar.update(len(chunk))
    frame = pd.DataFrame(sums.reshape(len(conditions), n_rows), index=conditions, columns=genes)
    frame = frame.T.groupby(level=0, sort=False).sum().T  # a symbol listed twice (two Ensembl ids) is summed
    frame.insert(0, "n_cells", np.bincount(cell_condition[cell_condition >= 0], minlength=len(conditions)))
    frame.index.name = "condition"
    return frame.reset_index()


# --- the proxy (preprocess, no torch) -----------------------------------------------------------------


def log_profiles(bulk: pd.DataFrame) -> pd.DataFrame:
    """log1p(10^4 counts / total) of each pseudobulk row, indexed by condition."""
    counts = bulk.set_index("condition").drop(columns="n_cells")
    return np.log1p(1e4 * counts.div(counts.sum(axis=1), axis=0))


def proxy(bulk: pd.DataFrame, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Genes with single perturbations, response genes, their shifts, the target shift and a diagnostic
    (Pearson r of the additive prediction against every measured double's shift)."""
    n_cells = bulk.set_index("condition")["n_cells"]
    if CONTROL not in n_cells.index:
        raise ValueError("no control cells (guide identities made of NegCtrl guides only) in the data")
    profiles = log_profiles(bulk)
    enough = n_cells[n_cells >= int(spec["min_cells"])].index
    singles = sorted(c for c in enough if c != CONTROL and "+" not in c)
    if len(singles) < int(spec["k"]):
        raise ValueError(
            f"only {len(singles)} genes have a single perturbation with >= {spec['min_cells']} cells; k = {spec['k']}"
        )
    doubles = sorted(c for c in enough if c.count("+") == 1 and all(g in singles for g in c.split("+")))
    shifts = profiles.loc[singles + doubles] - profiles.loc[CONTROL]
    candidates = [g for g in shifts.columns if g not in set(singles)]
    variance = shifts.loc[singles, candidates].var(axis=0)
    response = list(variance.sort_values(ascending=False, kind="stable").index[: int(spec["n_response_genes"])])
    target = spec["target"]
    if target is None:
        if not doubles:
            raise ValueError("no double perturbation of two single-perturbed genes to use as the target")
        target = max(doubles, key=lambda c: (n_cells[c], c))
    elif target not in doubles:
        raise ConfigError(
            f"target = {target!r} is not a double perturbation of two genes with single perturbations "
            f"of >= {spec['min_cells']} cells; available: {', '.join(doubles[:20])}{' ...' if len(doubles) > 20 else ''}"
        )
    single_shift = shifts.loc[singles, response].to_numpy()
    index = {g: i for i, g in enumerate(singles)}
    additive = [single_shift[[index[g] for g in d.split("+")]].sum(0) for d in doubles]
    measured = shifts.loc[doubles, response].to_numpy()
    r = float(np.corrcoef(np.ravel(additive), np.ravel(measured))[0, 1]) if doubles else float("nan")
    return {
        "genes": singles,
        "response_genes": response,
        "single_shift": single_shift,
        "target": target,
        "target_shift": shifts.loc[target, response].to_numpy(),
        "additive_r": r,
        "n_doubles": len(doubles),
    }


def gene_set_log_rewards(
    single_shift: np.ndarray, target_shift: np.ndarray, k: int, tau: float
) -> tuple[np.ndarray, np.ndarray]:
    """All k-sets of genes (rows of `single_shift`) in colex order and log R(S) = -||sum shift - target||^2 /
    (tau ||target||^2), floored at LOG_REWARD_FLOOR."""
    sets = np.array(sorted(itertools.combinations(range(len(single_shift)), k), key=lambda s: s[::-1]), dtype=np.int64)
    predicted = single_shift[sets].sum(axis=1)
    distance = ((predicted - target_shift) ** 2).sum(-1) / (tau * float((target_shift**2).sum()))
    return sets, np.maximum(-distance, LOG_REWARD_FLOOR)


def colex_rank(sets: np.ndarray) -> np.ndarray:
    """Rank of each sorted k-set (c_1 < ... < c_k) in colex order: sum_i C(c_i, i)."""
    sets = np.asarray(sets, dtype=np.int64)
    return sum(np.array([math.comb(int(c), i + 1) for c in sets[:, i]], dtype=np.int64) for i in range(sets.shape[1]))


def target(bulk: pd.DataFrame, spec: Mapping[str, Any]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Exact target over gene sets: state (colex rank), items, genes, log_reward, reward, pi, is_mode (the
    `n_modes` highest rewards); and the proxy's description for the file's metadata."""
    p = proxy(bulk, spec)
    sets, log_r = gene_set_log_rewards(p["single_shift"], p["target_shift"], int(spec["k"]), float(spec["tau"]))
    genes = np.array(p["genes"])
    frame = pd.DataFrame(
        {
            "state": colex_rank(sets),
            "items": [" ".join(map(str, s)) for s in sets],
            "genes": ["+".join(genes[s]) for s in sets],
            "log_reward": log_r,
        }
    )
    frame["reward"] = np.exp(frame["log_reward"])
    frame["pi"] = frame["reward"] / frame["reward"].sum()
    order = np.argsort(-frame["log_reward"].to_numpy(), kind="stable")
    frame["is_mode"] = False
    frame.loc[order[: int(spec["n_modes"])], "is_mode"] = True
    meta = {
        "genes": p["genes"],
        "response_genes": p["response_genes"],
        "target": p["target"],
        "additive_r": p["additive_r"],
        "n_doubles": p["n_doubles"],
    }
    return frame.sort_values("state").reset_index(drop=True), meta


# --- a seeded stand-in in the same file format ----------------------------------------------------------


def write_synthetic_norman(
    folder: Path, seed: int, n_genes: int = 60, n_perturbed: int = 6, cells_per_condition: int = 30
) -> dict[str, Path]:
    """GSE133344's four files for a small seeded population: controls, every single and every double of
    `n_perturbed` genes; each perturbation shifts a few response genes (doubles: the sum plus a small
    interaction), counts are Poisson."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    symbols = [f"GENE{i}" for i in range(n_genes)]
    perturbed = symbols[:n_perturbed]
    base = rng.gamma(2.0, 2.0, n_genes)
    effect = {g: np.where(rng.random(n_genes) < 0.2, rng.normal(0, 1.0, n_genes), 0.0) for g in perturbed}
    conditions = [("NegCtrl0_NegCtrl0__NegCtrl0_NegCtrl0", np.zeros(n_genes))]
    conditions += [(f"{g}_NegCtrl0__{g}_NegCtrl0", effect[g]) for g in perturbed]
    conditions += [
        (f"{a}_{b}__{a}_{b}", effect[a] + effect[b] + rng.normal(0, 0.2, n_genes))
        for a, b in itertools.combinations(perturbed, 2)
    ]
    columns, identities = [], []
    for guide, shift in conditions:
        for _ in range(cells_per_condition):
            barcode = f"{''.join(rng.choice(list('ACGT'), 16))}-1"
            columns.append(rng.poisson(base * np.exp(shift)))
            identities.append((barcode, guide))
    counts = np.array(columns).T  # genes x cells
    paths = {key: folder / name for key, name in FILES.items()}
    rows, cols = np.nonzero(counts)
    with gzip.open(paths["matrix"], "wt") as handle:
        handle.write("%%MatrixMarket matrix coordinate integer general\n%synthetic GSE133344 stand-in\n")
        handle.write(f"{counts.shape[0]} {counts.shape[1]} {rows.size}\n")
        handle.writelines(f"{r + 1} {c + 1} {counts[r, c]}\n" for r, c in zip(rows, cols))
    with gzip.open(paths["genes"], "wt") as handle:
        handle.writelines(f"ENSG{i:011d}\t{s}\n" for i, s in enumerate(symbols))
    with gzip.open(paths["barcodes"], "wt") as handle:
        handle.writelines(f"{b}\n" for b, _ in identities)
    with gzip.open(paths["identities"], "wt") as handle:
        handle.write(
            "cell_barcode,guide_identity,read_count,UMI_count,coverage,gemgroup,good_coverage,number_of_cells\n"
        )
        handle.writelines(f"{b},{g},100,10,10.0,1,True,1\n" for b, g in identities)
    return paths
