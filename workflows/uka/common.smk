# uka: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def uka_methods(world):
    """The methods evaluated in a world: `methods` in the main world, `control.methods` in the control world."""
    return UKA["methods"] if world == "main" else UKA["control"]["methods"]


def uka_trainer(method):
    """The method whose training memory `method` is evaluated with (None: no memory)."""
    from paperflow.uka.agents import TRAINED

    return TRAINED[method]


def uka_worlds():
    return ["main", UKA["control"]["world"]]


def uka_trained(world):
    """The methods with a training job in `world`."""
    return sorted({uka_trainer(m) for m in uka_methods(world)} - {None})


def uka_memory_input(wildcards):
    trainer = uka_trainer(wildcards.method)
    return {"memory": uka_path("models", wildcards.world, trainer, "memory.parquet")} if trainer else {}


def uka_report_inputs(wildcards):
    """Every world's per-user and per-turn tables and every training log, keyed by (world, method)."""
    evals = {(w, m): uka_path("eval", w, m, "per_user.parquet") for w in uka_worlds() for m in uka_methods(w)}
    turns = {(w, m): uka_path("eval", w, m, "per_turn.parquet") for w in uka_worlds() for m in uka_methods(w)}
    logs = {(w, m): uka_path("models", w, m, "attempts.csv") for w in uka_worlds() for m in uka_trained(w)}
    return {**keyed("per_user", evals), **keyed("per_turn", turns), **keyed("attempts", logs)}


# paper scale (paper.smk defines UKA_REFERENCE before its stages call these)
def uka_paper_trained():
    return sorted({uka_trainer(m) for m in UKA["methods"]} - {None})


def uka_paper_memory(wildcards):
    trainer = uka_trainer(wildcards.method)
    return {"memory": uka_path("models", trainer, "memory.parquet")} if trainer else {}


def uka_judged():
    return [m for m in UKA["methods"] if m != UKA_REFERENCE]
