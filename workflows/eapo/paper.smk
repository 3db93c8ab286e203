# eapo at paper scale (source.kind math): the pretrained model (`pretrained`) downloaded once and each dataset of
# `math.datasets` (the training set and the benchmarks) at its pinned Hub commit (config, else
# config/locks/eapo.json, written by `paperflow pin eapo`); prompts in the model's template; pi_E, then each method
# and seed, trained by TRL's GRPOTrainer with EAPO's sampler on one node's GPUs (torchrun); dapo and luffy by their
# authors' verl recipes (verl-recipe's DAPO, LUFFY's verl fork) on the same node class, merged to Hugging Face
# folders the same evaluate rule reads; avg@k with math-verify.
from paperflow.core.download import read_lock_revisions
from paperflow.eapo.paper import check as eapo_paper_check
from paperflow.eapo.paper import train_job_gpus as eapo_train_job_gpus
from paperflow.eapo.recipes import RECIPE_METHODS as EAPO_RECIPE_METHODS

eapo_paper_check(EAPO)
EAPO_MATH = EAPO["math"]
EAPO_CACHE = f"{RUN.resources}/eapo"
EAPO_LOCK = read_lock_revisions("eapo", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
EAPO_BENCH = list(EAPO_MATH["benchmarks"])
EAPO_TRAIN_GPUS = int(EAPO["resources"].get("train_gpus", EAPO["resources"]["gpus"]))
EAPO_WILDCARDS = {
    "dataset": "|".join(EAPO_MATH["datasets"]),
    "method": "|".join(EAPO["methods"]),
    "trl_method": "|".join(m for m in EAPO["methods"] if m not in EAPO_RECIPE_METHODS) or "(?!)",
    "seed": r"[0-9]+",
}
EAPO_RECIPES = EAPO_MATH.get("recipes")  # dapo and luffy: their authors' verl recipes (paperflow.eapo.recipes)


def eapo_train_resources(method=None):
    """heavy_resources of a train job: the learner's GPUs plus, with math.rollout_backend vllm, the policy
    server's and (injecting methods) pi_E's (paper.train_job_gpus); `method` None: per the {method} wildcard."""
    out = heavy_resources("train_node_gpu", EAPO, stage="train")
    if EAPO_MATH.get("rollout_backend", "transformers") == "vllm":
        if method is None:
            out["gpu"] = lambda wildcards: eapo_train_job_gpus(EAPO, wildcards.method)
        else:
            out["gpu"] = eapo_train_job_gpus(EAPO, method)
    return out


def eapo_locked(repo_type, hub):
    return EAPO_LOCK.get(f"{repo_type}:{hub}")


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


rule eapo_download_model:
    output:
        eapo_path("models", "pretrained.json"),
    log:
        eapo_path("logs", "download_model.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        pretrained=EAPO["pretrained"],
        locked=eapo_locked("model", EAPO["pretrained"]["hub"]),
        cache=EAPO_CACHE,
        code=code_param("lm", "workflows/eapo/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule eapo_download:
    output:
        eapo_path("raw", "{dataset}.parquet"),
    log:
        eapo_path("logs", "download_{dataset}.log"),
    wildcard_constraints:
        dataset=EAPO_WILDCARDS["dataset"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        dataset=lambda wc: EAPO_MATH["datasets"][wc.dataset],
        locked=lambda wc: eapo_locked("dataset", EAPO_MATH["datasets"][wc.dataset]["hub"]),
        cache=EAPO_CACHE,
        code=code_param("lm", "workflows/eapo/scripts/download_math.py"),
    script:
        "scripts/download_math.py"


rule eapo_preprocess:
    input:
        raw=eapo_path("raw", "{dataset}.parquet"),
        pretrained=eapo_path("models", "pretrained.json"),
    output:
        eapo_path("data", "{dataset}.parquet"),
    log:
        eapo_path("logs", "preprocess_{dataset}.log"),
    wildcard_constraints:
        dataset=EAPO_WILDCARDS["dataset"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        template=lambda wc: EAPO_MATH["prompt_template"],  # a function: its {problem} is no wildcard
        max_prompt_length=EAPO_MATH["max_prompt_length"],
        code=code_param("lm", "workflows/eapo/scripts/preprocess_math.py"),
    script:
        "scripts/preprocess_math.py"


rule eapo_train_prior:
    input:
        start=eapo_path("models", "pretrained.json"),
        train=eapo_path("data", f"{EAPO_MATH['train_set']}.parquet"),
    output:
        model=eapo_path("models", "prior.json"),
        history=eapo_path("models", "prior_history.csv"),
        rollouts=eapo_path("models", "prior_rollouts.csv"),
    log:
        eapo_path("logs", "train_prior.log"),
    benchmark:
        eapo_path("benchmarks", "train_prior.tsv")
    priority: 20  # every injecting arm waits for pi_E
    conda:
        env_file("lm")  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
    threads: 8
    resources:
        **eapo_train_resources("grpo"),
    params:
        settings={
            **{k: EAPO[k] for k in ("pretrained", "math", "eapo")},
            "rl": {**EAPO["rl"], "lr": EAPO["prior"]["lr"]},
        },
        method="grpo",
        seed=EAPO["prior"]["seed"],
        steps=EAPO["prior"]["steps"],
        processes=EAPO_TRAIN_GPUS,
        code=code_param("lm", "workflows/eapo/scripts/train_math.py"),
    script:
        "scripts/train_math.py"


rule eapo_train:
    input:
        unpack(eapo_paper_start),
        train=eapo_path("data", f"{EAPO_MATH['train_set']}.parquet"),
    output:
        model=eapo_path("models", "{method}", "seed{seed}.json"),
        history=eapo_path("models", "{method}", "seed{seed}_history.csv"),
        rollouts=eapo_path("models", "{method}", "seed{seed}_rollouts.csv"),
    log:
        eapo_path("logs", "train", "{method}_seed{seed}.log"),
    benchmark:
        eapo_path("benchmarks", "train_{method}_seed{seed}.tsv")
    wildcard_constraints:
        method=EAPO_WILDCARDS["trl_method"],
        seed=EAPO_WILDCARDS["seed"],
    conda:
        env_file("lm")  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
    threads: 8
    resources:
        **eapo_train_resources(),
    params:
        settings={k: EAPO[k] for k in ("pretrained", "math", "rl", "eapo")},
        method=lambda wc: wc.method,
        seed=lambda wc: int(wc.seed),
        steps=None,
        processes=EAPO_TRAIN_GPUS,
        code=code_param("lm", "workflows/eapo/scripts/train_math.py"),
    script:
        "scripts/train_math.py"


rule eapo_evaluate:
    input:
        **keyed("bench", {b: eapo_path("data", f"{b}.parquet") for b in EAPO_BENCH}),
        model=eapo_path("models", "{method}", "seed{seed}.json"),
    output:
        eapo_path("eval", "{method}", "seed{seed}.parquet"),
    log:
        eapo_path("logs", "evaluate", "{method}_seed{seed}.log"),
    benchmark:
        eapo_path("benchmarks", "evaluate_{method}_seed{seed}.tsv")
    wildcard_constraints:
        method=EAPO_WILDCARDS["method"],
        seed=EAPO_WILDCARDS["seed"],
    conda:
        env_file("lm")  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
    threads: 4
    resources:
        **heavy_resources("infer_gpu", EAPO, stage="evaluate"),
    params:
        ks={b: EAPO_MATH["datasets"][b]["k"] for b in EAPO_BENCH},
        evaluation=EAPO_MATH["evaluation"],
        device=EAPO["pretrained"]["device"],
        dtype=EAPO["pretrained"]["dtype"],
        stop_tokens=EAPO_MATH["rollout"]["stop_tokens"],
        code=code_param("lm", "workflows/eapo/scripts/evaluate_math.py"),
    script:
        "scripts/evaluate_math.py"


rule eapo_report:
    input:
        **keyed(
            "eval", {(m, s): eapo_path("eval", m, f"seed{s}.parquet") for m in EAPO["methods"] for s in EAPO["seeds"]}
        ),
    output:
        report=eapo_path("report.md"),
        metrics=eapo_path("metrics.json"),
        table=report(eapo_path("tables", "avg_at_k.csv"), category="eapo", labels={"table": "avg@k"}),
    log:
        eapo_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        benchmarks=EAPO_BENCH,
        ks={b: EAPO_MATH["datasets"][b]["k"] for b in EAPO_BENCH},
        pretrained=EAPO["pretrained"],
        code=code_param("lm", "workflows/eapo/scripts/report_math.py"),
    script:
        "scripts/report_math.py"


# --- dapo and luffy: the authors' verl recipes (paperflow.eapo.recipes) -------------------------------------------
rule eapo_download_recipes:
    output:
        eapo_path("recipes", "source.json"),
    log:
        eapo_path("logs", "download_recipes.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light", runtime=60),
    params:
        repos=EAPO_RECIPES["repos"] if EAPO_RECIPES else None,
        cache=EAPO_CACHE,
        code=code_param("lm", "workflows/eapo/scripts/download_recipes.py"),
    script:
        "scripts/download_recipes.py"


rule eapo_recipe_data:
    input:
        train=eapo_path("data", f"{EAPO_MATH['train_set']}.parquet"),
        validation=eapo_path("data", f"{EAPO_RECIPES['validation'] if EAPO_RECIPES else 'none'}.parquet"),
    output:
        dapo_train=eapo_path("recipes", "dapo_train.parquet"),
        validation=eapo_path("recipes", "validation.parquet"),
        luffy_validation=eapo_path("recipes", "luffy_validation.parquet"),
    log:
        eapo_path("logs", "recipe_data.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        template=lambda wc: EAPO_MATH["prompt_template"],  # a function: its {problem} is no wildcard
        code=code_param("lm", "workflows/eapo/scripts/recipe_data.py"),
    script:
        "scripts/recipe_data.py"


rule eapo_prior_traces:
    input:
        prior=eapo_path("models", "prior.json"),
        train=eapo_path("data", f"{EAPO_MATH['train_set']}.parquet"),
    output:
        eapo_path("models", "prior_traces.parquet"),
    log:
        eapo_path("logs", "prior_traces.log"),
    benchmark:
        eapo_path("benchmarks", "prior_traces.tsv")
    conda:
        env_file("lm")  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
    threads: 4
    resources:
        **heavy_resources("infer_gpu", EAPO, stage="evaluate"),
    params:
        samples=EAPO_RECIPES["luffy"]["trace_samples"] if EAPO_RECIPES else None,
        evaluation=EAPO_MATH["evaluation"],
        device=EAPO["pretrained"]["device"],
        dtype=EAPO["pretrained"]["dtype"],
        stop_tokens=EAPO_MATH["rollout"]["stop_tokens"],
        code=code_param("lm", "workflows/eapo/scripts/prior_traces.py"),
    script:
        "scripts/prior_traces.py"


rule eapo_luffy_data:
    input:
        train=eapo_path("data", f"{EAPO_MATH['train_set']}.parquet"),
        traces=eapo_path("models", "prior_traces.parquet"),
    output:
        eapo_path("recipes", "luffy_train.parquet"),
    log:
        eapo_path("logs", "luffy_data.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        template=lambda wc: EAPO_MATH["prompt_template"],
        code=code_param("lm", "workflows/eapo/scripts/luffy_data.py"),
    script:
        "scripts/luffy_data.py"


rule eapo_train_dapo:
    input:
        start=eapo_path("models", "pretrained.json"),
        recipes=eapo_path("recipes", "source.json"),
        train=eapo_path("recipes", "dapo_train.parquet"),
        validation=eapo_path("recipes", "validation.parquet"),
    output:
        model=eapo_path("models", "dapo", "seed{seed}.json"),
    log:
        eapo_path("logs", "train", "dapo_seed{seed}.log"),
    benchmark:
        eapo_path("benchmarks", "train_dapo_seed{seed}.tsv")
    wildcard_constraints:
        seed=EAPO_WILDCARDS["seed"],
    conda:
        env_file("lm-verl")  # verl 0.9.1 (+ vLLM 0.24, math-verify): the DAPO recipe's trainer and model merger
    threads: 16
    resources:
        **heavy_resources("train_node_gpu", EAPO, stage="train"),
    params:
        method="dapo",
        seed=lambda wc: int(wc.seed),
        settings={k: EAPO[k] for k in ("pretrained", "math", "rl", "resources")},
        code=code_param("lm-verl", "workflows/eapo/scripts/train_recipe.py"),
    script:
        "scripts/train_recipe.py"


rule eapo_train_luffy:
    input:
        start=eapo_path("models", "pretrained.json"),
        recipes=eapo_path("recipes", "source.json"),
        train=eapo_path("recipes", "luffy_train.parquet"),
        validation=eapo_path("recipes", "luffy_validation.parquet"),
    output:
        model=eapo_path("models", "luffy", "seed{seed}.json"),
    log:
        eapo_path("logs", "train", "luffy_seed{seed}.log"),
    benchmark:
        eapo_path("benchmarks", "train_luffy_seed{seed}.tsv")
    wildcard_constraints:
        seed=EAPO_WILDCARDS["seed"],
    conda:
        env_file("lm-verl-luffy")  # LUFFY's own stack; its verl fork comes from the checkout (PYTHONPATH)
    threads: 16
    resources:
        **heavy_resources("train_node_gpu", EAPO, stage="train"),
    params:
        method="luffy",
        seed=lambda wc: int(wc.seed),
        settings={k: EAPO[k] for k in ("pretrained", "math", "rl", "resources")},
        code=code_param("lm-verl-luffy", "workflows/eapo/scripts/train_recipe.py"),
    script:
        "scripts/train_recipe.py"
