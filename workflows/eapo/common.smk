# eapo: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def eapo_seeds(method):
    """The seeds a method runs (the gated methods: `seeds`; the report-only ones: `report_seeds`)."""
    from paperflow.eapo.settings import seeds_of

    return seeds_of(method, EAPO)


def eapo_checkpoints(method):
    """{seed: final checkpoint} of a method."""
    return {s: eapo_path("models", method, f"seed{s}.safetensors") for s in eapo_seeds(method)}


def eapo_all_checkpoints(wildcards):
    """Every (method, seed) checkpoint, keyed for the evaluation."""
    return keyed("ckpt", {(m, s): path for m in EAPO["methods"] for s, path in eapo_checkpoints(m).items()})


def eapo_report_inputs(wildcards):
    """The report's inputs keyed by method: curves and mechanism counts."""
    return {
        **keyed("curves", {m: eapo_path("models", m, "curves.csv") for m in EAPO["methods"]}),
        **keyed("mechanism", {m: eapo_path("models", m, "mechanism.csv") for m in EAPO["methods"]}),
    }


def eapo_prior_input(wildcards):
    """pi_E for the methods that inject it, replay it or start from it; the others start before it exists."""
    from paperflow.eapo.methods import method

    m = method(wildcards.method)
    return (
        {"prior": eapo_path("models", "prior.safetensors")}
        if (m.start == "prior" or m.prior == "prior" and (m.inject or m.luffy))
        else {}
    )
