# promptscale: the functions of its workflow files (paths, keyed inputs, lock look-ups), included first by the
# Snakefile; names carry the slug.


def promptscale_seed_outputs(seed):
    """The checkpoints and tables one seed's training writes (cold start, then each EM variant)."""
    d = promptscale_path("models", f"seed{seed}")
    out = {"q0": f"{d}/q0.safetensors", "p0": f"{d}/p0.safetensors", "history": f"{d}/coldstart_history.csv"}
    for v in PROMPTSCALE["variants"]:
        out[f"{v}_q"] = f"{d}/{v}_q.safetensors"
        out[f"{v}_p"] = f"{d}/{v}_p.safetensors"
    out["curves"] = f"{d}/em_curves.csv"
    return out


def promptscale_prompt_models(wildcards):
    """Every prompt model the evaluation synthesises from, keyed by (variant, seed): the cold start (E = 0),
    each EM variant's final p (em, randomk, randomk2), and the no-rationale model at the report seeds."""
    models = {}
    for s in PROMPTSCALE["seeds"]:
        models[("coldstart", s)] = promptscale_seed_outputs(s)["p0"]
        for v in PROMPTSCALE["variants"]:
            models[(v, s)] = promptscale_seed_outputs(s)[f"{v}_p"]
    for s in PROMPTSCALE["report_seeds"]:
        models[("norationale", s)] = promptscale_path("models", "direct", f"seed{s}.safetensors")
    return keyed("model", models)


def promptscale_report_inputs(wildcards):
    return {
        **keyed("curves", {s: promptscale_seed_outputs(s)["curves"] for s in PROMPTSCALE["seeds"]}),
        **keyed("history", {s: promptscale_seed_outputs(s)["history"] for s in PROMPTSCALE["seeds"]}),
        **keyed("solver", {s: promptscale_path("solver", f"seed{s}.csv") for s in PROMPTSCALE["seeds"]}),
        **keyed("dpo", {s: promptscale_path("solver", f"dpo_seed{s}.csv") for s in PROMPTSCALE["report_seeds"]}),
    }


# --- paper scale (paper.smk and the files it includes); the globals they read are defined there ---------------------


def promptscale_locked(repo_type, hub):
    """The pinned commit of a Hub repo from config/locks/promptscale.json (None where it is not pinned)."""
    return PROMPTSCALE_LOCK.get(f"{repo_type}:{hub}")


def promptscale_model(which, m):
    """The JSON naming the folder of q_m or p_m (the train rule's output)."""
    return promptscale_path("models", f"{which}{m}.json")


def promptscale_train_inputs(wildcards):
    """What q_m / p_m train from: the pretrained prompt model and the cold-start triples at m = 0; the model of
    m - 1 and the kept rationales of E-step m - 1 after."""
    m = int(wildcards.m)
    inputs = {"train": promptscale_path("data", "train.jsonl")}
    if m == 0:
        return inputs | {"start": promptscale_path("models", "prompt.json")}
    return inputs | {
        "start": promptscale_model(wildcards.which, m - 1),
        "kept": promptscale_path("em", f"kept{m - 1}.jsonl"),
    }


def promptscale_code_triples(wildcards):
    """The annotate jobs' triples that promptscale_preprocess merges (none unless code is a seed domain)."""
    return [promptscale_path("annotate", f"{a}.jsonl") for a in PROMPTSCALE_ANNOTATORS]


def promptscale_annotator(wildcards):
    return PROMPTSCALE_ANNOTATE["annotators"][wildcards.annotator]


def promptscale_codeforces_report(wildcards=None):
    """Per policy, what the report reads: the Elo when the judge's verdicts are configured, else the submissions'
    summary (whose status names codeforces.verdicts)."""
    return {
        p: promptscale_path("codeforces", f"{p}_elo.json" if p in PROMPTSCALE_CF_VERDICTS else f"{p}.json")
        for p in PROMPTSCALE_POLICIES
    }
