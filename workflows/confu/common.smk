# confu: the functions of its Snakefile and of the scale files it includes (paths, keyed inputs), included first by
# it; names carry the slug.


def confu_heads(method):
    return [confu_path("models", method, f"seed{s}.safetensors") for s in CONFU_SEEDS]


def confu_target_files():
    """The one target (trained once, with the seed `target.seed`, and shared by every draft seed as the paper's
    drafts share their target): its checkpoint, draft data and lossless references."""
    t = CONFU_TARGET_SEED
    return {
        "target": confu_path("models", f"target_seed{t}.safetensors"),
        "data": confu_path("data", f"draft_seed{t}.safetensors"),
        "references": confu_path("eval", f"references_seed{t}.parquet"),
    }


def confu_train_inputs(wildcards):
    """The target and its draft data; the continued methods also read the EAGLE-3 heads they start from."""
    files = confu_target_files()
    inputs = {"target": files["target"], "data": files["data"]}
    if wildcards.method not in CONFU_BASE_METHODS:
        inputs.update(keyed("init", dict(zip(CONFU_SEEDS, confu_heads("eagle3")))))
    return inputs


def confu_evaluate_inputs(wildcards):
    """The problems, the target, its references (every draft seed's) and the method's head per seed."""
    files = confu_target_files()
    return {
        "problems": confu_path("raw", "problems.parquet"),
        "target": files["target"],
        "references": files["references"],
        **keyed("head", dict(zip(CONFU_SEEDS, confu_heads(wildcards.method)))),
    }


def confu_lm_report_inputs():
    """The real target's decodings the synthetic report reads (cpu scale, `pretrained_cpu`): every method's and the
    plain decoding, per target; none elsewhere."""
    if not CONFU["pretrained_cpu"]:
        return {}
    lm = CONFU["pretrained_cpu"]
    return {
        "lm_evals": [confu_path("lm", "eval", t, f"{m}.parquet") for t in lm["targets"] for m in lm["methods"]],
        "lm_plain": [confu_path("lm", "eval", t, "plain.parquet") for t in lm["targets"]],
    }


# paper scale (paper.smk)


def confu_locked(repo_type, hub):
    return CONFU_LOCK.get(f"{repo_type}:{hub}")


def confu_paper_train_inputs(wildcards):
    """The target, its regenerated shards; the continued methods also read its EAGLE-3 head."""
    t = wildcards.target
    inputs = {
        "pretrained": confu_path("models", t, "pretrained.json"),
        "data": [confu_path("data", t, f"draft_shard{s}.safetensors") for s in CONFU_SHARDS],
    }
    if wildcards.method not in CONFU_BASE_METHODS:
        inputs["init"] = confu_path("models", t, "eagle3.safetensors")
    return inputs


# the real target at cpu scale (pretrained_cpu.smk)


def confu_lm_path(*parts):
    return confu_path("lm", *parts)


def confu_lm_train_inputs(wildcards):
    """The target and its regenerated shards; the continued methods also read its EAGLE-3 head."""
    t = wildcards.target
    inputs = {
        "pretrained": confu_lm_path("models", t, "pretrained.json"),
        "data": [confu_lm_path("data", t, f"draft_shard{s}.safetensors") for s in CONFU_LM_SHARDS],
    }
    if wildcards.method not in CONFU_BASE_METHODS:
        inputs["init"] = confu_lm_path("models", t, "eagle3.safetensors")
    return inputs
