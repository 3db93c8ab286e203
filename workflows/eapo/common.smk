# eapo: the functions of its Snakefile and rule files (paths, keyed inputs, resources), included first by it;
# names carry the slug.


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


# paper scale (paper.smk defines EAPO_LOCK before its stages call these)
def eapo_train_resources(method=None):
    """heavy_resources of a train job: the learner's GPUs plus, with math.rollout_backend vllm, the policy
    server's and (injecting methods) pi_E's (paper.train_job_gpus); `method` None: per the {method} wildcard."""
    from paperflow.eapo.paper import train_job_gpus

    out = heavy_resources("train_node_gpu", EAPO, stage="train")
    if "rollout_backend" in EAPO["math"] and EAPO["math"]["rollout_backend"] == "vllm":
        if method is None:
            out["gpu"] = lambda wildcards: train_job_gpus(EAPO, wildcards.method)
        else:
            out["gpu"] = train_job_gpus(EAPO, method)
    return out


def eapo_locked(repo_type, hub):
    """The revision `paperflow pin eapo` locked for a Hub repo (None where the lock has none)."""
    key = f"{repo_type}:{hub}"
    return EAPO_LOCK[key] if key in EAPO_LOCK else None


def eapo_paper_start(wildcards):
    """The model a run starts from and the experience model it injects (spec section 3: from_prior starts from
    pi_E; eapo_baseprior injects the base model, the negative control)."""
    from paperflow.eapo.methods import method

    m = method(wildcards.method)
    models = {"base": eapo_path("models", "pretrained.json"), "prior": eapo_path("models", "prior.json")}
    out = {"start": models[m.start]}
    if m.inject:
        out["prior"] = models[m.prior]
    return out
