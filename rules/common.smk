# Shared helpers for every paper workflow: config, paths, resource classes, code-hash params.
# Included once by the top-level Snakefile before any paper.
import sys
from pathlib import Path

PAPERFLOW_ROOT = Path(workflow.basedir)
if str(PAPERFLOW_ROOT / "modules") not in sys.path:
    sys.path.insert(0, str(PAPERFLOW_ROOT / "modules"))

from paperflow.core.codehash import code_hash
from paperflow.core.keys import keyed
from paperflow.core.launch import launch_command
from paperflow.core.config import load_run_config, prepare_job_environment

prepare_job_environment(PAPERFLOW_ROOT)

RUN = load_run_config(config, PAPERFLOW_ROOT)

# Resource classes (nf-core's labels): a rule names one; a site changes sizes here, and where the
# jobs go (partitions, GPU types, accounts) in its profile, never in a rule. Only *_gpu classes
# ever receive `gpu` > 0, and only when the paper's config asks for GPUs at that scale.
RESOURCE_CLASSES = {
    "cpu_light": {"mem_mb": 2000, "runtime": 15},
    "cpu_medium": {"mem_mb": 8000, "runtime": 60},
    "train_gpu": {"mem_mb": 16000, "runtime": 240},
    "infer_gpu": {"mem_mb": 16000, "runtime": 120},
    # several GPUs of one node for one training job (an RL or draft-model run of a 7B model); the job starts
    # one process per GPU itself (torchrun_prefix below), so SLURM gives it one task on one node
    "train_node_gpu": {"mem_mb": 256000, "runtime": 1440, "nodes": 1, "tasks": 1},
}


def resources_of(klass, gpu=0, gpu_model=None, **overrides):
    """The resources of a rule of class `klass`; `gpu`, `gpu_model` and overrides come from the paper's
    config. Only `gpu` (never `gres`) is emitted, so the SLURM plugin writes one --gpus flag."""
    if klass not in RESOURCE_CLASSES:
        raise ValueError(f"unknown resource class {klass!r}; defined: {', '.join(RESOURCE_CLASSES)}")
    if gpu and not klass.endswith("_gpu"):
        raise ValueError(f"resource class {klass!r} is not a GPU class; only *_gpu classes may request GPUs")
    res = dict(RESOURCE_CLASSES[klass], **overrides)
    if klass.endswith("_gpu"):
        res["gpu"] = int(gpu)
        if gpu and gpu_model:
            res["gpu_model"] = gpu_model
    return res


def heavy_resources(klass, paper_cfg, stage=None, dataset=None, gpus=None):
    """The resources of a heavy rule of class `klass` (a *_gpu class) from the paper's `resources`
    config block: `gpus` and `gpu_model`, and for `stage` its `<stage>_runtime_min`, `<stage>_mem_mb` and
    `<stage>_gpus` where the block sets them (the class's sizes and `gpus` otherwise). With `dataset` (the
    name of the rule's dataset wildcard), only the datasets in `resources.gpu_datasets` get the GPUs: the
    rest run on CPU partitions. With `gpus` (an int, or a function of the job's wildcards: a count per model or
    method that the paper's config gives), that count replaces the config's for this rule, unless the config
    asks for no GPUs at all (tiny and smoke). The one way a rule asks for GPUs.
    """
    res = paper_cfg["resources"]
    overrides = {}
    per_job = gpus
    gpus = res["gpus"]
    if stage is not None:
        for key, name in (("runtime", f"{stage}_runtime_min"), ("mem_mb", f"{stage}_mem_mb")):
            if name in res:
                overrides[key] = res[name]
        gpus = res.get(f"{stage}_gpus", gpus)  # e.g. training on a node's 8 GPUs, evaluation on one
    out = resources_of(klass, gpu=gpus, gpu_model=res["gpu_model"], **overrides)
    if per_job is not None:
        if dataset is not None:
            raise ValueError("heavy_resources: give either `dataset` or `gpus`, not both")
        if gpus:
            out["gpu"] = per_job if callable(per_job) else int(per_job)
        return out
    if dataset is not None and gpus:
        # GPUs only for the datasets the config names as heavy; the others run on CPU partitions
        if "gpu_datasets" not in res:
            raise ValueError(f"resources.gpu_datasets is missing: the rule asks GPUs per {dataset!r}")
        if res["gpu_model"]:
            raise ValueError("resources.gpu_model with per-dataset GPUs is not supported: set gpu_model: null")
        heavy = set(res["gpu_datasets"])
        out["gpu"] = lambda wildcards: gpus if wildcards[dataset] in heavy else 0
    return out


def torchrun_prefix(n_procs):
    """The command that starts a training module on `n_procs` processes of this node: plain `python` for one,
    `torchrun --standalone` (one process per GPU) for more. A rule of class train_node_gpu runs
    `{params.launch} -m paperflow.<slug>.<entry> ...` with `launch=torchrun_prefix(gpus)`."""
    return launch_command(int(n_procs))


def env_file(stack):
    """Absolute path of envs/<stack>.yaml, for a rule's `conda:` directive."""
    path = PAPERFLOW_ROOT / "envs" / f"{stack}.yaml"
    if not path.is_file():
        raise ValueError(
            f"no conda env {path}; available: {', '.join(p.stem for p in (PAPERFLOW_ROOT / 'envs').glob('*.yaml'))}"
        )
    return str(path)


def code_param(stack, script):
    """The `code` param of a rule: changes when the library code its script imports changes (rerun
    trigger), and tells the provenance record which script, modules and env the job ran.
    `script` is relative to the repository root."""
    return {
        "hash": code_hash(PAPERFLOW_ROOT / script),
        "env": f"envs/{stack}.yaml",
        "script": script,
        "scale": RUN.scale,
        "generated_roots": [RUN.results, RUN.resources],
    }


def seed_groups(seeds, per_job):
    """Seeds cut into groups of `per_job`, run one after the other in one job, keyed by the {group}
    wildcard ('s0-1-2'): process start dominates small runs, while one seed per job suits a cluster."""
    return {
        "s" + "-".join(map(str, seeds[i : i + per_job])): list(seeds[i : i + per_job])
        for i in range(0, len(seeds), per_job)
    }


# Stage tables (paperflow.core.stages): a paper declares its stages with paper_stages(...); rules/stages.smk, included
# last by the top Snakefile, makes each one a rule.
from paperflow.core.stages import Stage as stage, StageTables

STAGE_TABLES = StageTables()


def paper_stages(slug, paper_cfg, path, *stages):
    """Declare the stages of paper `slug` (its config `paper_cfg`, its results path builder `path`)."""
    STAGE_TABLES.declare(
        slug,
        stages,
        config=paper_cfg,
        path=path,
        code_param=code_param,
        env_file=env_file,
        root=PAPERFLOW_ROOT,
    )


def hub_model_stage(slug, name, spec, key, cache, output, extra=None, **stage_kwargs):
    """The stage `name` of paper `slug` that downloads a model repo at its pinned Hub commit into `cache`
    (paperflow.core.hub_download.download_model, by the shared rules/scripts/download_model.py): `spec` the model's
    config block (hub, revision, files, optional offline), `key` the config key an unpinned revision is refused by,
    `extra` what the JSON written to `output` holds besides hub, revision and folder; each of the three may be a
    function of the job's wildcards. `stage_kwargs` go to the stage (resources, wildcards, log; `params` join these)."""
    params = {"spec": spec, "slug": slug, "key": key, "cache": cache, "extra": {} if extra is None else extra}
    params.update(stage_kwargs.pop("params", {}))
    return stage(
        name,
        script="rules/scripts/download_model.py",
        env="lm",
        output=output,
        params=params,
        **stage_kwargs,
    )
