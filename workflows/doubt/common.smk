# doubt: the functions of its Snakefile and rule files (keyed inputs, wildcard patterns, resources), included first
# by it; names carry the slug.


def doubt_samples(wildcards):
    """Every seed's sampled answer sets, keyed by seed."""
    return keyed("samples", {s: doubt_path("samples", f"seed{s}.parquet") for s in DOUBT["seeds"]})


def doubt_scores(wildcards):
    """Every detector's scores, keyed by method."""
    return keyed("scores", {m: doubt_path("scores", f"{m}.parquet") for m in DOUBT["methods"]})


def doubt_evaluate_inputs(wildcards):
    """The evaluation's sampled sets and scores, keyed by seed and by method."""
    return {**doubt_samples(wildcards), **doubt_scores(wildcards)}


# paper scale (paper.smk defines DOUBT_LOCK before its stages call these)
def doubt_alternatives(names):
    """A wildcard pattern matching exactly `names` (none: a pattern that matches nothing)."""
    import re

    return "|".join(re.escape(n) for n in names) or "(?!)"


def doubt_locked(repo_type, hub):
    """The revision `paperflow pin doubt` locked for a Hub repo (None where the lock has none)."""
    key = f"{repo_type}:{hub}"
    return DOUBT_LOCK[key] if key in DOUBT_LOCK else None


def doubt_vlm_gpus(wildcards):
    """The GPUs of one MLLM's sampling job: its `gpus` (several of one node for the 26B/72B models; the job shards
    the model over them; one where it says none), none where the paper block's resources ask for none."""
    if not DOUBT["resources"]["gpus"]:
        return 0
    spec = DOUBT["vlms"][wildcards.vlm]
    return int(spec["gpus"]) if "gpus" in spec else 1


def doubt_score_inputs(wildcards):
    """The detector's inputs: the sets, their embeddings, and for semantic entropy the entailment judge's output;
    VL-Uncertainty: its answers to the perturbed prompts, and on a free-form benchmark their entailment."""
    from paperflow.doubt import benchmarks
    from paperflow.doubt.paper import VL_UNCERTAINTY, needs_entailment

    run = f"{wildcards.bench}_seed{wildcards.seed}.parquet"
    if wildcards.method == VL_UNCERTAINTY:
        out = {
            "questions": doubt_path("data", f"{wildcards.bench}.parquet"),
            "perturbed": doubt_path("vlu_samples", wildcards.vlm, run),
        }
        if benchmarks.KIND_OF[wildcards.bench] == benchmarks.FREE_FORM:
            out["entail"] = doubt_path("vlu_entailment", wildcards.vlm, run)
        return out
    out = {
        "questions": doubt_path("data", f"{wildcards.bench}.parquet"),
        "samples": doubt_path("samples", wildcards.vlm, run),
        "embeddings": doubt_path("embeddings", wildcards.vlm, run),
    }
    if needs_entailment(wildcards.method):
        out["entail"] = doubt_path("entailment", wildcards.vlm, run)
    return out
