# itpo: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def itpo_checkpoints(methods):
    """{(method, group): the train job's checkpoint file} for `methods`."""
    return {(m, g): itpo_path("models", m, f"{g}.safetensors") for m in methods for g in ITPO_GROUPS}


def itpo_policies(wildcards):
    """Every train job's checkpoints (policies inside), keyed for the evaluation."""
    return keyed("ckpt", itpo_checkpoints(ITPO["methods"]))


def itpo_analysis_inputs(wildcards):
    """The checkpoints of the methods that train a PRM, keyed for the turn analysis."""
    from paperflow.itpo.settings import PRM_METHODS

    return keyed("ckpt", itpo_checkpoints([m for m in ITPO["methods"] if m in PRM_METHODS]))


def itpo_curves(wildcards):
    return keyed(
        "curves", {(m, g): itpo_path("models", m, f"{g}_curves.csv") for m in ITPO["methods"] for g in ITPO_GROUPS}
    )


# paper scale (paper.smk defines ITPO_LOCK, ITPO_TASKS before its stages call these)
def itpo_locked(ref):
    return ITPO_LOCK.get(f"{ref['repo_type']}:{ref['hub']}")


def itpo_runs_of(name, ext):
    """One file of every (task, method, group) run, keyed (task, method, group)."""
    runs = [(t, m, g) for t in ITPO_TASKS for m in ITPO["methods"] for g in ITPO_GROUPS]
    return keyed(name, {(t, m, g): itpo_path("eval", t, f"{m}_{g}.{ext}") for t, m, g in runs})


def itpo_turn_logs():
    """The per-turn log of every (task, method, group) training run, keyed (task, method, group)."""
    runs = [(t, m, g) for t in ITPO_TASKS for m in ITPO["methods"] for g in ITPO_GROUPS]
    return keyed("turns", {(t, m, g): itpo_path("runs", t, m, g, "turns.jsonl") for t, m, g in runs})
