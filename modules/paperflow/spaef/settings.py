"""Config rules of spaef that its JSON schema cannot express, and the (sample, seed) units of a run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from paperflow.core.config import ConfigError, reject_unknown, require_keys, require_member

# what each method trains: which graphs (LM-built or plain expression/correlation) and which gate
METHODS = {
    "spaef": {"graphs": "lm", "fusion": "learned"},
    "spaef_nolm": {"graphs": "nolm", "fusion": "learned"},
    "spot_only": {"graphs": "lm", "fusion": "spot"},
    "gene_only": {"graphs": "lm", "fusion": "gene"},
    "fixed_half": {"graphs": "lm", "fusion": "half"},
}
BASELINES = ("raw", "delaunay_smooth", "magic", "magic_impute", "graphst")
PUBLISHED_BASELINES = ("magic_impute", "graphst")  # run by the published packages magic-impute and graphst
NEEDS = {"synthetic": ("n_rows", "n_cols", "n_domains"), "visium": ("files",)}
# the keys each config block's library code reads (config/schemas/spaef.schema.yaml lists the same)
KEYS = {
    "datasets.<synthetic>": (
        "kind",
        "n_rows",
        "n_cols",
        "n_domains",
        "n_modules",
        "genes_per_module",
        "n_housekeeping",
        "module_boost",
        "housekeeping_boost",
        "library_size",
        "library_sd",
        "library_gradient",
        "nb_theta",
        "capture",
        "n_decoy_pairs",
        "decoy_sd",
        "ggi_genes_per_module",
    ),
    "embedding": ("spot_model", "gene_model", "batch_size", "device", "sentence_tokens", "omiclip", "genept"),
    "graphs": ("ggi_seed", "spot", "gene"),
    "graphs.spot": (
        "hidden",
        "heads",
        "latent",
        "dropout",
        "lr",
        "epochs",
        "k",
        "double_sigmoid",
        "directed_like_code",
    ),
    "graphs.gene": ("k", "threshold"),
    "model": ("hidden", "latent", "heads", "dropout", "gate"),
    "train": ("epochs", "lr", "gamma", "mu_penalty", "engine"),
    "baseline": ("smooth_alpha", "magic_k", "magic_t", "magic_pcs", "seed", "magic_impute", "graphst"),
    "evaluate": ("n_pcs", "n_marker_genes", "gmm_starts"),
}


def known_keys(block: str, cfg: Mapping[str, Any]) -> None:
    """ConfigError when `cfg`, the config block `block`, has a key its library code does not read."""
    reject_unknown(cfg, KEYS[block], block)


def sample_names(cfg: dict[str, Any]) -> list[str]:
    return sorted({sample for sample, _ in units(cfg)})


def units(cfg: dict[str, Any]) -> list[tuple[str, int]]:
    """(sample, seed) pairs. A synthetic dataset is drawn once per seed (sample `<name>_s<seed>`, the
    spec's "one dataset instance per seed"); a real dataset is one sample trained with every seed."""
    out = []
    for name in cfg["run_datasets"]:
        synthetic = cfg["datasets"][name]["kind"] == "synthetic"
        out += [(f"{name}_s{s}" if synthetic else name, s) for s in cfg["seeds"]]
    return out


def seeds_of(cfg: dict[str, Any], sample: str) -> list[int]:
    return [s for name, s in units(cfg) if name == sample]


def model_downloads(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`embedding_downloads` of the paper's whole config."""
    return embedding_downloads(cfg["embedding"])


def embedding_downloads(enc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The language-model files the embed stage reads (paper scale: the OmiCLIP checkpoint, GenePT's
    embeddings and GGI split) of the `embedding` block, as {cache folder: {key: {url, sha256, key}}} where `key`
    names the file's checksum in the config; none for the MiniLM stand-in."""
    out: dict[str, dict[str, Any]] = {}
    if enc["spot_model"] == "omiclip":
        out["omiclip"] = {"file": {**enc["omiclip"], "key": "embedding.omiclip.sha256"}}
    if enc["gene_model"] == "genept":
        out["genept"] = {k: {**v, "key": f"embedding.genept.{k}.sha256"} for k, v in enc["genept"].items()}
    return out


def model_paths(cfg: dict[str, Any], cache: str) -> list[str]:
    """Where model_downloads land in the cache (paperflow.spaef.data.fetch_all's layout)."""
    return [
        f"{cache}/{name}/{PurePosixPath(spec['url']).name}"
        for name, files in model_downloads(cfg).items()
        for spec in files.values()
    ]


def dataset_of(cfg: dict[str, Any], sample: str) -> str:
    return sample.rsplit("_s", 1)[0] if sample not in cfg["datasets"] else sample


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_datasets"]:
        require_member(name, cfg["datasets"], source, "run_datasets[...]")
    require_member(cfg["claim_dataset"], cfg["run_datasets"], source, "claim_dataset")
    for method in ("spaef", "spaef_nolm"):
        if method not in cfg["methods"]:
            raise ConfigError(
                f"{source}: methods must contain '{method}' (the claims compare spaef with spaef_nolm); got {cfg['methods']}"
            )
    for base in ("raw", "delaunay_smooth"):
        if base not in cfg["baselines"]:
            raise ConfigError(
                f"{source}: baselines must contain '{base}' (a gated claim compares with it); got {cfg['baselines']}"
            )
    for name, spec in cfg["datasets"].items():
        require_keys(spec, NEEDS[spec["kind"]], f"{source}: datasets.{name} (kind {spec['kind']})")
        if spec["kind"] == "synthetic" and spec["n_domains"] > 6:
            raise ConfigError(
                f"{source}: datasets.{name}.n_domains = {spec['n_domains']}; SynthSRT has 6 modules, at most 6 domains"
            )
    enc = cfg["embedding"]
    for key, model in (("omiclip", enc["spot_model"]), ("genept", enc["gene_model"])):
        if model == key and key not in enc:
            raise ConfigError(
                f"{source}: embedding.{'spot' if key == 'omiclip' else 'gene'}_model = '{key}' needs embedding.{key} (its download)"
            )
    if enc["device"] == "cuda" and cfg["resources"]["gpus"] == 0:
        raise ConfigError(f"{source}: embedding.device = 'cuda' but resources.gpus = 0; use 'cpu' or request a GPU")


DOMAIN_METRICS = ("ari_gmm", "nmi_gmm", "ari_kmeans")


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics of the claim dataset that paperflow.spaef.claims.metrics_table holds: PCC to the clean signal
    where there is one (synthetic), domain ARI / NMI where there are domain labels (synthetic, or a Visium set
    with a `labels` file), and Moran's I always (paperflow.spaef.stages.evaluate_stage)."""
    spec = cfg["datasets"][cfg["claim_dataset"]]
    synthetic = spec["kind"] == "synthetic"
    labelled = synthetic or "labels" in spec.get("files", {})
    return [*(["pcc"] if synthetic else []), *(DOMAIN_METRICS if labelled else ()), "morans_i"]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The denoisers and baselines scored on the claim dataset, and the clean signal where there is one."""
    clean = ["clean"] if cfg["datasets"][cfg["claim_dataset"]]["kind"] == "synthetic" else []
    return [*cfg["methods"], *cfg["baselines"], *clean]
