# dualreform: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def dualreform_iterations(method):
    """How many rounds a preference method trains: DualReform iterates, the others run one round."""
    return DUALREFORM["iterations"] if method == "dualreform" else 1


def dualreform_checkpoints(method):
    """{(seed, iteration): checkpoint} of a method; the SFT stage is sft_human's, iteration 0."""
    if method == "raw":
        return {}
    if method == "sft_human":
        return {(s, 0): dualreform_path("models", "sft_human", f"seed{s}.safetensors") for s in DUALREFORM["seeds"]}
    return {
        (s, i): dualreform_path("models", method, f"seed{s}_it{i}.safetensors")
        for s in DUALREFORM["seeds"]
        for i in range(1, dualreform_iterations(method) + 1)
    }


def dualreform_report_inputs(wildcards):
    """The report's inputs keyed by method: evaluations, training histories and references."""
    trained = [m for m in DUALREFORM_PREFERENCE if m in DUALREFORM["methods"]]
    return {
        **keyed("eval", {m: dualreform_path("eval", f"{m}.parquet") for m in DUALREFORM["methods"]}),
        **keyed("history", {m: dualreform_path("models", m, "history.csv") for m in trained}),
        **keyed("refs", {m: dualreform_path("models", m, "refs.parquet") for m in trained}),
    }


# paper scale (paper.smk): DUALREFORM_LOCK and DUALREFORM_DENSE are defined there
def dualreform_locked(ref):
    return DUALREFORM_LOCK.get(f"{ref['repo_type']}:{ref['hub']}")


def dualreform_rounds(method, seed):
    """The round checkpoints of a trained method and seed, iteration 1 first."""
    n = DUALREFORM["iterations"] if method == "dualreform" else 1
    return [dualreform_path("models", method, f"seed{seed}_it{i}.safetensors") for i in range(1, n + 1)]


def dualreform_eval_inputs(wildcards):
    """The pretrained model (not for raw), the method's rounds (trained methods) and the dense index (when set)."""
    out = {}
    if DUALREFORM_DENSE:
        out |= {"dense": dualreform_path("models", "dense.json"), "dense_index": dualreform_path("data", "dense.npy")}
    if wildcards.method == "raw":
        return out
    out["pretrained"] = dualreform_path("models", "pretrained.json")
    if wildcards.method == "prompted":
        return out
    rounds = dualreform_rounds(wildcards.method, wildcards.seed)
    return out | keyed("ckpt", {i + 1: p for i, p in enumerate(rounds)})
