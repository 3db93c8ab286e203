# promptscale: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


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
