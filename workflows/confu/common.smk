# confu: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


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
    if not CONFU.get("pretrained_cpu"):
        return {}
    lm = CONFU["pretrained_cpu"]
    return {
        "lm_evals": [confu_path("lm", "eval", t, f"{m}.parquet") for t in lm["targets"] for m in lm["methods"]],
        "lm_plain": [confu_path("lm", "eval", t, "plain.parquet") for t in lm["targets"]],
    }
