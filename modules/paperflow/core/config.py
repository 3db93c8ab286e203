"""Load and validate the run configuration: `config/config.yaml` and one `config/<slug>.yaml` per paper.

A paper's config file holds a `defaults` block, one block per scale (`tiny`, `smoke`, `cpu`, `paper`) and
the paper's `claims` (one list for every scale; see `paperflow.core.claims`); the resolved config of a run is
`defaults` deep-merged with the block of the run's scale, with the claims under `claims`. Every block
is checked against `config/schemas/<slug>.schema.yaml` before merging (so a typo is reported in the
block where it was made), and the merged result is checked again with the schema's `required` lists.
Errors name the file, the key path and what is allowed, and are raised before any job runs.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib
import json
import os
import pickle
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# libyaml's safe loader is several times faster at DAG build; PyYAML without libyaml has only the Python one
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

SCALES = ("tiny", "smoke", "cpu", "paper")
PAPER_FILE_KEYS = ("description", "defaults", *SCALES, "claims")


class ConfigError(ValueError):
    """A configuration value is missing, misspelt, of the wrong type or out of range."""


def repo_root() -> Path:
    """The checkout that holds `config/`, `workflows/` and `modules/`."""
    return Path(__file__).resolve().parents[3]


def prepare_job_environment(root: Path) -> None:
    """Environment every job inherits (locally, and on SLURM through --export=ALL): paperflow importable
    from this checkout whichever env runs the job, and wandb offline unless the user set a mode."""
    modules = str(root / "modules")
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != modules]
    os.environ["PYTHONPATH"] = os.pathsep.join([modules, *rest])
    os.environ.setdefault("WANDB_MODE", "offline")


def read_yaml(path: Path) -> Any:
    """The YAML document in `path` (safe loading, libyaml's C parser where installed); ConfigError if the
    file is missing or not valid YAML."""
    try:
        with open(path, "rb") as fh:
            return yaml.load(fh, Loader=YAML_LOADER)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def available_papers(root: Path | None = None) -> list[str]:
    """Slugs that have a workflow (`workflows/<slug>/Snakefile`) in this checkout."""
    root = root or repo_root()
    return sorted(p.parent.name for p in (root / "workflows").glob("*/Snakefile"))


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` wins key by key; nested mappings merge, everything else is replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _without_required(schema: Any) -> Any:
    """The schema with every `required` list dropped: a scale block may set any subset of keys."""
    if isinstance(schema, dict):
        return {k: _without_required(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_without_required(v) for v in schema]
    return schema


def _key_path(parts: Iterable[Any]) -> str:
    text = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in parts).replace(".[", "[")
    return text or "<top level>"


def _did_you_mean(word: str, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(allowed), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def describe_error(err: jsonschema.ValidationError, source: str, prefix: str = "") -> str:
    """One line that names the file, the key and what would have been accepted."""
    parts = ([prefix] if prefix else []) + list(err.absolute_path)
    where = _key_path(parts)
    value = err.instance
    schema = err.schema
    if err.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        return "; ".join(
            f"{source}: unknown key '{_key_path(parts + [k])}'{_did_you_mean(k, allowed)}; allowed keys here: {', '.join(allowed)}"
            for k in sorted(set(value) - set(allowed))
        )
    if err.validator == "enum":
        allowed = ", ".join(repr(v) for v in schema["enum"])
        return f"{source}: {where} = {value!r} is not allowed; allowed values: {allowed}"
    if err.validator == "type":
        return f"{source}: {where} = {value!r} has the wrong type; expected {err.validator_value}"
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if err.validator in bounds:
        return f"{source}: {where} = {value!r} is out of range; must be {bounds[err.validator]} {err.validator_value}"
    if err.validator == "required":
        missing = [repr(_key_path(parts + [k])) for k in err.validator_value if k not in value]
        return f"{source}: missing key(s) {', '.join(missing)}"
    return f"{source}: {where}: {err.message}"


def validate(instance: Any, schema: Mapping[str, Any], source: str, prefix: str = "") -> None:
    """Raise one ConfigError that lists every violation, each on its own line."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        # one line per violation: the errors of several missing keys of one mapping all describe as the same line
        lines = dict.fromkeys(describe_error(e, source, prefix) for e in errors)
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class RunConfig:
    """What a run needs to know: its scale, the papers it composes and each paper's resolved config."""

    scale: str
    papers: tuple[str, ...]
    results: str
    resources: str
    wandb: dict[str, Any]
    paper_configs: dict[str, dict[str, Any]]

    def out(self, slug: str, *parts: str) -> str:
        """Path of a result file of `slug` at this run's scale: results/<scale>/<slug>/<parts>."""
        return "/".join([self.results, self.scale, slug, *parts])

    def paths(self, slug: str):
        """`out` bound to one paper: paths("ph_vae")("eval", "x.json")."""
        return lambda *parts: self.out(slug, *parts)

    def out_root(self, *parts: str) -> str:
        """Path of a cross-paper file at this run's scale: results/<scale>/<parts>."""
        return "/".join([self.results, self.scale, *parts])


def load_paper_config(slug: str, scale: str, root: Path | None = None) -> dict[str, Any]:
    """Resolve `config/<slug>.yaml` for one scale, validating every block and the merged result."""
    root = root or repo_root()
    path = root / "config" / f"{slug}.yaml"
    source = str(path.relative_to(root))
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with keys {', '.join(PAPER_FILE_KEYS)}")
    for key in raw:
        if key not in PAPER_FILE_KEYS:
            raise ConfigError(
                f"{source}: unknown top-level key '{key}'{_did_you_mean(key, PAPER_FILE_KEYS)}; "
                f"allowed keys: {', '.join(PAPER_FILE_KEYS)}"
            )
    schema = read_yaml(root / "config" / "schemas" / f"{slug}.schema.yaml")
    partial = _without_required(schema)
    for block in ("defaults", *SCALES):
        validate(raw.get(block) or {}, partial, source, prefix=block)
    if scale not in raw:
        raise ConfigError(f"{source}: no '{scale}' block; scale '{scale}' needs one (it may be empty: {scale}: {{}})")
    merged = deep_merge(raw.get("defaults") or {}, raw.get(scale) or {})
    where = f"{source} (defaults merged with '{scale}')"
    validate(merged, schema, where)
    _paper_checks(slug, merged, where)
    if "claims" in raw:
        if "claims" in merged:
            raise ConfigError(
                f"{where}: a key 'claims' inside the scale blocks clashes with the top-level claims list "
                "(the resolved config holds the list under 'claims'); rename the inner key"
            )
        merged["claims"], merged["claims_not_measured"] = _checked_claims(
            slug, raw["claims"], merged, scale, source, root
        )
    return merged


def _checked_claims(
    slug: str, raw: Any, cfg: dict[str, Any], scale: str, source: str, root: Path
) -> tuple[list[Any], list[str]]:
    """The paper's claims measured at this scale and the ids of those that are not: schema-checked
    (config/schemas/claims.schema.yaml), parsed, and checked against the metrics and methods the paper's code
    declares for this config (`paperflow.<slug>.settings.claim_metrics(cfg)` and `claim_methods(cfg)`), so a
    misspelt name fails when the DAG is built. A claim whose metric or methods this scale does not produce is
    an error where the claim is gated at this scale, and is listed as not measured elsewhere."""
    from paperflow.core import claimspec as claims_lib

    validate(raw, read_yaml(root / "config" / "schemas" / "claims.schema.yaml"), source, prefix="claims")
    specs = claims_lib.parse_claims(raw, source)
    settings = importlib.import_module(f"paperflow.{slug}.settings")
    for name in ("claim_metrics", "claim_methods"):
        if not hasattr(settings, name):
            raise ConfigError(f"{source}: paperflow.{slug}.settings lacks {name}, which the claims are checked against")
    kept = claims_lib.check_vocabulary(
        specs, metrics=settings.claim_metrics(cfg), methods=settings.claim_methods(cfg), source=source, scale=scale
    )
    by_id = {spec.id: spec for spec in kept}
    measured = [
        {k: v for k, v in c.items() if k != "control" or by_id[c["id"]].control is not None}
        for c in copy.deepcopy(raw)
        if c["id"] in by_id
    ]
    return measured, [c["id"] for c in raw if c["id"] not in by_id]


def _paper_checks(slug: str, cfg: dict[str, Any], source: str) -> None:
    """Run `paperflow.<slug>.settings.check(cfg, source)`: rules a JSON schema cannot express."""
    try:
        settings = importlib.import_module(f"paperflow.{slug}.settings")
    except ModuleNotFoundError as exc:
        if exc.name != f"paperflow.{slug}.settings":
            raise
        return
    settings.check(cfg, source)


def require_member(value: Any, allowed: Iterable[Any], source: str, key: str) -> None:
    """ConfigError naming `key` unless `value` is one of `allowed`."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(
            f"{source}: {key} = {value!r} is not allowed{_did_you_mean(str(value), map(str, allowed))}; "
            f"allowed values: {', '.join(map(repr, allowed))}"
        )


def require_choices(
    values: Iterable[Any],
    *,
    source: str,
    key: str,
    known: Iterable[Any] | None = None,
    required: Iterable[Any] = (),
    noun: str = "value",
    why: str = "the gated claims compare them",
) -> None:
    """ConfigError naming `key` for an entry of the list `values` that is not in `known` (with a did-you-mean and
    the choices), or for an entry of `required` that the list lacks (with `why` it is needed)."""
    values = list(values)
    if known is not None:
        known = list(known)
        for value in values:
            if value not in known:
                raise ConfigError(
                    f"{source}: {key}: unknown {noun} {value!r}{_did_you_mean(str(value), map(str, known))}; "
                    f"choose from {', '.join(map(str, known))}"
                )
    required = list(required)
    missing = [r for r in required if r not in values]
    if missing:
        raise ConfigError(f"{source}: {key} lacks {missing}, which {why}; it must include {required}")


def load_run_config(config: Mapping[str, Any], root: Path | None = None) -> RunConfig:
    """Validate Snakemake's `config` (config/config.yaml plus any `--config` overrides) and every enabled paper."""
    root = root or repo_root()
    validate(dict(config), read_yaml(root / "config" / "schemas" / "config.schema.yaml"), "config/config.yaml")
    known = available_papers(root)
    papers = config["papers"]
    if papers == "all":
        papers = known
    elif isinstance(papers, str):
        papers = [p for p in papers.replace(",", " ").split() if p]
    for slug in papers:
        if slug not in known:
            raise ConfigError(
                f"config: papers contains unknown paper '{slug}'{_did_you_mean(slug, known)}; "
                f"available papers: {', '.join(known)}"
            )
    scale = config["scale"]
    key = _resolved_key(papers, scale, root)
    paper_configs = _kept_resolved(root, key)
    if paper_configs is None:
        paper_configs = {slug: load_paper_config(slug, scale, root) for slug in papers}
        _keep_resolved(root, key, paper_configs)
    return RunConfig(
        scale=scale,
        papers=tuple(papers),
        results=config["results"],
        resources=config["resources"],
        wandb=dict(config["wandb"]),
        paper_configs=paper_configs,
    )


# The resolved paper configs of a run are kept in the checkout (.snakemake/paperflow/resolved/<key>.pickle), so
# that a Snakemake command, and every job it starts, skips reading and validating some forty YAML files (a third
# of a second of each start). The key is the sha256 of everything the result depends on: the scale, the papers,
# the bytes of each paper's config and schema and of the claims schema, and the code hash (paperflow.core.codehash)
# of this module and of each paper's settings module, which check the config beyond its schema. Only a config
# that validated is kept; a file that cannot be read or written is ignored (the configs are then resolved anew).
RESOLVED_FORMAT = 1  # raise it whenever what load_paper_config returns changes shape
RESOLVED_KEEP = 32  # newest entries kept


def _resolved_key(papers: Iterable[str], scale: str, root: Path) -> str | None:
    from paperflow.core.codehash import code_hash

    digest = hashlib.sha256(json.dumps([RESOLVED_FORMAT, sys.version_info[:2], scale]).encode())
    package = Path(__file__).resolve().parents[1]
    try:
        parts = [root / "config" / "schemas" / "claims.schema.yaml", Path(__file__)]
        for slug in papers:
            parts += [root / "config" / f"{slug}.yaml", root / "config" / "schemas" / f"{slug}.schema.yaml"]
            settings = package / slug / "settings.py"
            if settings.is_file():
                parts.append(settings)
        for part in parts:
            closure = code_hash(part) if part.suffix == ".py" else ""  # the modules it imports
            digest.update(f"{part.name}\0{hashlib.sha256(part.read_bytes()).hexdigest()}\0{closure}\0".encode())
    except OSError:
        return None  # a missing file: load_paper_config names it
    return digest.hexdigest()


def _resolved_dir(root: Path) -> Path:
    return root / ".snakemake" / "paperflow" / "resolved"


def _kept_resolved(root: Path, key: str | None) -> dict[str, dict[str, Any]] | None:
    if key is None:
        return None
    try:
        with open(_resolved_dir(root) / f"{key}.pickle", "rb") as fh:
            kept = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def _keep_resolved(root: Path, key: str | None, paper_configs: dict[str, dict[str, Any]]) -> None:
    """Write the entry atomically (a concurrent job may write the same one) and drop all but the newest few."""
    if key is None:
        return
    folder = _resolved_dir(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=folder, suffix=".tmp", delete=False) as fh:
            pickle.dump(paper_configs, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(fh.name, folder / f"{key}.pickle")
        entries = sorted(folder.glob("*.pickle"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in entries[RESOLVED_KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def summarised_papers(run: RunConfig, root: Path | None = None) -> list[str]:
    """The papers the summary of `run`'s scale covers, in the paper list's order: the ones the run composes and every
    other paper with results at that scale (its metrics.json, relative to the working directory as the run's paths
    are). A run narrowed to some papers thus summarises what a plain run after it does: Snakemake sees the same set
    of inputs, and plans no summary job where every paper's results are current."""
    return [
        slug for slug in available_papers(root) if slug in run.papers or Path(run.out(slug, "metrics.json")).is_file()
    ]


def require_keys(mapping: Mapping[str, Any], keys: Iterable[str], where: str) -> None:
    """Raise naming `where` and every key of `keys` that `mapping` lacks (cross-key checks in a paper's
    `settings.check`, e.g. the keys a dataset kind needs)."""
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise ConfigError(f"{where} is missing key(s) {', '.join(missing)}")


def reject_unknown(mapping: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Raise when library code receives a key it does not use, instead of dropping it silently."""
    allowed = list(allowed)
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        hint = _did_you_mean(unknown[0], allowed)
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}{hint}; allowed: {', '.join(allowed)}"
        )
