"""SynthSRT: a seeded Visium-like spatial transcriptomics generator with known clean signal (spec §4).

Hexagonal grid of spots, K wavy layered domains, gene modules switched on per domain, NB counts
thinned by a capture probability (dropout), and two spurious biases the LM priors should fix:
a smooth library-size gradient across the slide and decoy gene pairs from different modules that
share a technical noise factor. Genes get one-line descriptions naming their pathway, and a
disjoint set of extra genes supplies labelled interaction pairs (same pathway = interacting).
"""

from __future__ import annotations

from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
from scipy import sparse

from paperflow.spaef.settings import known_keys

PATHWAYS = [
    "Wnt signalling",
    "interferon immune response",
    "myelination of axons",
    "synaptic vesicle transmission",
    "mitotic cell cycle",
    "hypoxia and glycolysis",
]
TEMPLATES = [
    "{g} is a member of pathway M{m}, involved in {p}.",
    "{g} encodes a protein of pathway M{m} that takes part in {p}.",
    "{g}: pathway M{m} gene with a role in {p}.",
]
HOUSEKEEPING_TEXT = "{g} is a housekeeping gene of basic cellular metabolism, expressed in every cell."


def hex_grid(n_rows: int, n_cols: int, spacing: float = 100.0) -> np.ndarray:
    """Visium-like coordinates: odd rows shifted by half a spacing, rows sqrt(3)/2 apart."""
    r, c = np.divmod(np.arange(n_rows * n_cols), n_cols)
    return np.column_stack([(c + 0.5 * (r % 2)) * spacing, r * spacing * np.sqrt(3) / 2])


def wavy_domains(coords: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """K layers: quantiles of y + a sine of x (DLPFC-like wavy stripes)."""
    x = (coords[:, 0] - coords[:, 0].min()) / np.ptp(coords[:, 0])
    y = (coords[:, 1] - coords[:, 1].min()) / np.ptp(coords[:, 1])
    t = y + 0.12 * np.sin(2 * np.pi * (1.5 * x + rng.uniform()))
    return np.searchsorted(np.quantile(t, np.linspace(0, 1, k + 1)[1:-1]), t)


def domain_modules(k: int, n_modules: int) -> list[list[int]]:
    """Domain d switches on module d and, for the first n_modules - k domains, module k + d too."""
    return [[d] + ([k + d] if k + d < n_modules else []) for d in range(k)]


def gene_description(name: str, module: int, rng: np.random.Generator) -> str:
    if module < 0:
        return HOUSEKEEPING_TEXT.format(g=name)
    return TEMPLATES[rng.integers(len(TEMPLATES))].format(g=name, m=module + 1, p=PATHWAYS[module])


def generate(spec: dict[str, Any], seed: int) -> ad.AnnData:
    """One SynthSRT instance: X = observed counts (sparse), layers['clean'] = log1p-CPM of the true rate."""
    known_keys("datasets.<synthetic>", spec)
    rng = np.random.default_rng(seed)
    n_mod, per_mod, n_hk = spec["n_modules"], spec["genes_per_module"], spec["n_housekeeping"]
    coords = hex_grid(spec["n_rows"], spec["n_cols"])
    n = len(coords)
    domain = wavy_domains(coords, spec["n_domains"], rng)
    module = np.concatenate([np.repeat(np.arange(n_mod), per_mod), -np.ones(n_hk, int)])
    g = len(module)
    # module profile per domain, softmax-normalised (spec §4: lambda_ig = s_i * profile)
    base = rng.normal(0.0, 0.5, g)
    base[module < 0] += spec["housekeeping_boost"]
    logits = np.tile(base, (spec["n_domains"], 1))
    for d, mods in enumerate(domain_modules(spec["n_domains"], n_mod)):
        logits[d, np.isin(module, mods)] += spec["module_boost"]
    profile = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    xs = (coords[:, 0] - coords[:, 0].min()) / np.ptp(coords[:, 0])
    library = np.exp(
        rng.normal(np.log(spec["library_size"]), spec["library_sd"], n) + spec["library_gradient"] * (xs - 0.5)
    )
    rate = library[:, None] * profile[domain]
    # decoy pairs: genes of different modules that share one technical noise factor per spot
    tech = np.ones((n, g))
    module_genes = [np.flatnonzero(module == m) for m in range(n_mod)]
    decoys = []
    for _ in range(spec["n_decoy_pairs"]):
        m1, m2 = rng.choice(n_mod, 2, replace=False)
        a, b = rng.choice(module_genes[m1]), rng.choice(module_genes[m2])
        factor = np.exp(spec["decoy_sd"] * rng.normal(size=n))
        tech[:, a] *= factor
        tech[:, b] *= factor
        decoys.append((int(a), int(b)))
    theta = spec["nb_theta"]
    counts = rng.negative_binomial(theta, theta / (theta + rate * tech))
    counts = rng.binomial(counts, spec["capture"])
    names = [f"GENE_{i:03d}" for i in range(g)]
    clean = np.log1p(rate / rate.sum(1, keepdims=True) * 1e6)
    adata = ad.AnnData(
        X=sparse.csr_matrix(counts.astype(np.float32)),
        obs=pd.DataFrame(
            {"domain": pd.Categorical(domain.astype(str)), "library": library}, index=[f"spot{i:04d}" for i in range(n)]
        ),
        var=pd.DataFrame(
            {
                "module": module,
                "description": [gene_description(nm, m, rng) for nm, m in zip(names, module)],
                "housekeeping": module < 0,
            },
            index=names,
        ),
    )
    adata.layers["clean"] = clean.astype(np.float32)
    adata.obsm["spatial"] = coords
    adata.uns["decoy_pairs"] = np.array(decoys)
    adata.uns["ggi"] = ggi_pairs(spec, rng, first_index=g)
    adata.uns["synthetic"] = {"seed": seed, **{k: v for k, v in spec.items() if k != "kind"}}
    return adata


def ggi_pairs(spec: dict[str, Any], rng: np.random.Generator, first_index: int) -> dict[str, Any]:
    """Labelled interaction pairs on extra genes absent from the matrix: same pathway = 1, else 0
    (the stand-in for GenePT's GGI train split)."""
    n_mod, per = spec["n_modules"], spec["ggi_genes_per_module"]
    module = np.repeat(np.arange(n_mod), per)
    names = [f"GENE_{first_index + i:03d}" for i in range(len(module))]
    i, j = np.triu_indices(len(module), 1)
    label = (module[i] == module[j]).astype(int)
    keep = np.concatenate(
        [np.flatnonzero(label == 1), rng.choice(np.flatnonzero(label == 0), 2 * int(label.sum()), replace=False)]
    )
    return {
        "genes": np.array(names),
        "descriptions": np.array([gene_description(nm, m, rng) for nm, m in zip(names, module)]),
        "a": i[keep],
        "b": j[keep],
        "label": label[keep],
    }
