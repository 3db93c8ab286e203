# confu: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def confu_heads(method):
    return [confu_path("models", method, f"seed{s}.safetensors") for s in CONFU_SEEDS]


def confu_train_inputs(wildcards):
    """The targets and their draft data; the continued methods also read the EAGLE-3 heads they start from."""
    inputs = {
        **keyed("target", {s: confu_path("models", f"target_seed{s}.safetensors") for s in CONFU_SEEDS}),
        **keyed("data", {s: confu_path("data", f"draft_seed{s}.safetensors") for s in CONFU_SEEDS}),
    }
    if wildcards.method not in CONFU_BASE_METHODS:
        inputs.update(keyed("init", dict(zip(CONFU_SEEDS, confu_heads("eagle3")))))
    return inputs


def confu_evaluate_inputs(wildcards):
    """The problems, and per seed the target, its references and the method's head, keyed by seed."""
    return {
        "problems": confu_path("raw", "problems.parquet"),
        **keyed("target", {s: confu_path("models", f"target_seed{s}.safetensors") for s in CONFU_SEEDS}),
        **keyed("references", {s: confu_path("eval", f"references_seed{s}.parquet") for s in CONFU_SEEDS}),
        **keyed("head", dict(zip(CONFU_SEEDS, confu_heads(wildcards.method)))),
    }
