"""A paper's stages as data: each stage says once what it reads and writes, its env, resource class, the config keys
it reads and the script it runs; `rules/stages.smk` derives each Snakemake rule from it (name, log, benchmark,
conda env, code-hash param, script path). A paper's workflow declares its table with `paper_stages(...)`.

Derived, unless the stage says otherwise:
- the rule `<slug>_<name>`;
- the log `logs/<log_dir>/<tag>.log` of the paper's results (`logs/<name>.log` for a stage without a tag), where
  `log_dir` is the stage's name and `tag` the job's name pattern (`"{env}_{method}"`);
- the benchmark `benchmarks/<log_dir>_<tag>.tsv` where `benchmark=True`;
- the params: each key of `reads` (the paper's config value of that name), then `params`, then `code` (the
  script's code hash, its env and script path: `code_param`);
- the conda env `envs/<env>.yaml` and the script `workflows/<slug>/scripts/<script>` (a script named
  `rules/scripts/<file>` is a shared one, taken from the repository root as named).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CORE_SCRIPTS = "rules/scripts/"  # a stage's script under it is one every paper shares, named from the repository root


class StageError(ValueError):
    """A stage table that cannot make rules; the message is one line naming the stage and the key."""


@dataclass(frozen=True)
class Stage:
    name: str
    script: str
    env: str
    resources: Mapping[str, Any]
    output: Any
    input: Any = None
    unpack: Callable[..., Any] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    reads: Sequence[str] = ()
    wildcards: Mapping[str, str] = field(default_factory=dict)
    tag: str | None = None
    log_dir: str | None = None
    log: str | None = None
    benchmark: bool | str = False
    priority: int = 0
    threads: int = 1


def _split(value: Any) -> tuple[list[Any], dict[str, Any]]:
    """A directive's value as (positional, named): a mapping is named, a list positional (a mapping as its last item
    names the files after the positional ones), anything else one item."""
    if value is None:
        return [], {}
    if isinstance(value, Mapping):
        return [], dict(value)
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[-1], Mapping):
            return list(value[:-1]), dict(value[-1])
        return list(value), {}
    return [value], {}


def derive(
    slug: str,
    stage: Stage,
    config: Mapping[str, Any],
    path: Callable[..., str],
    code_param: Callable[[str, str], Any],
    env_file: Callable[[str], str],
    root: Any,
) -> dict[str, Any]:
    """The directives of the rule of `stage` of paper `slug` (its config `config`, its results path builder
    `path`), as the factory in rules/stages.smk hands them to Snakemake."""
    where = f"paper {slug}, stage {stage.name!r}"
    missing = [key for key in stage.reads if key not in config]
    if missing:
        raise StageError(f"{where}: reads {missing}, not keys of config/{slug}.yaml; it has {', '.join(config)}")
    twice = sorted(set(stage.reads) & set(stage.params))
    if twice or "code" in stage.params or "code" in stage.reads:
        raise StageError(f"{where}: params {twice or ['code']} are given twice (reads and params, or the derived code)")
    script = stage.script if stage.script.startswith(CORE_SCRIPTS) else f"workflows/{slug}/scripts/{stage.script}"
    if not (root / script).is_file():
        raise StageError(f"{where}: no script {script}")
    log_dir = stage.log_dir or stage.name
    if stage.log is not None:
        log = path("logs", stage.log)
    elif stage.tag:
        log = path("logs", log_dir, f"{stage.tag}.log")
    else:
        log = path("logs", f"{log_dir}.log")
    if isinstance(stage.benchmark, str):
        benchmark = path("benchmarks", stage.benchmark)
    elif stage.benchmark:
        benchmark = path("benchmarks", f"{log_dir}_{stage.tag}.tsv" if stage.tag else f"{log_dir}.tsv")
    else:
        benchmark = None
    input_args, input_kwargs = _split(stage.input)
    output_args, output_kwargs = _split(stage.output)
    params = {key: config[key] for key in stage.reads}
    params.update(stage.params)
    params["code"] = code_param(stage.env, script)
    return {
        "rule": f"{slug}_{stage.name}",
        "input_args": input_args,
        "input": input_kwargs,
        "unpack": stage.unpack,
        "output_args": output_args,
        "output": output_kwargs,
        "log": log,
        "benchmark": benchmark,
        "wildcards": dict(stage.wildcards),
        "conda": env_file(stage.env),
        "threads": stage.threads,
        "resources": dict(stage.resources),
        "priority": stage.priority,
        "params": params,
        "script": str(root / script),
    }


class StageTables:
    """Every paper's stage table, in the order the workflows declare them."""

    def __init__(self) -> None:
        self.rules: list[dict[str, Any]] = []
        self.stages: dict[str, list[Stage]] = {}

    def declare(self, slug: str, stages: Sequence[Stage], **derive_with: Any) -> None:
        names = [s.name for s in self.stages.get(slug, [])] + [s.name for s in stages]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise StageError(f"paper {slug}: stages {repeated} are declared twice")
        self.stages.setdefault(slug, []).extend(stages)
        self.rules.extend(derive(slug, stage, **derive_with) for stage in stages)
