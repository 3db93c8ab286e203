# eapo at paper scale (source.kind math): the pretrained model (`pretrained`) downloaded once and each dataset of
# `math.datasets` (the training set and the benchmarks) at its pinned Hub commit (config, else
# config/locks/eapo.json, written by `paperflow pin eapo`); prompts in the model's template; pi_E, then each method
# and seed, trained by TRL's GRPOTrainer with EAPO's sampler on one node's GPUs (torchrun); dapo and luffy by their
# authors' verl recipes (verl-recipe's DAPO, LUFFY's verl fork) on the same node class, merged to Hugging Face
# folders the same evaluate rule reads; avg@k with math-verify.
from paperflow.core.download import read_lock_revisions
from paperflow.eapo.paper import check as eapo_paper_check
from paperflow.eapo.recipes import RECIPE_METHODS as EAPO_RECIPE_METHODS

eapo_paper_check(EAPO)
EAPO_MATH = EAPO["math"]
EAPO_CACHE = f"{RUN.resources}/eapo"
EAPO_LOCK = read_lock_revisions("eapo", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
EAPO_BENCH = list(EAPO_MATH["benchmarks"])
EAPO_TRAIN_GPUS = int(
    EAPO["resources"]["train_gpus"] if "train_gpus" in EAPO["resources"] else EAPO["resources"]["gpus"]
)
EAPO_WILDCARDS = {
    "dataset": "|".join(EAPO_MATH["datasets"]),
    "method": "|".join(EAPO["methods"]),
    "trl_method": "|".join(m for m in EAPO["methods"] if m not in EAPO_RECIPE_METHODS) or "(?!)",
    "seed": r"[0-9]+",
}
# dapo and luffy: their authors' verl recipes (paperflow.eapo.recipes); None without math.recipes
EAPO_RECIPES = EAPO_MATH["recipes"] if "recipes" in EAPO_MATH else None
EAPO_TRAIN_SET = eapo_path("data", f"{EAPO_MATH['train_set']}.parquet")


paper_stages(
    "eapo",
    EAPO,
    eapo_path,
    hub_model_stage(
        "eapo",
        "download_model",
        EAPO["pretrained"],
        "pretrained.revision",
        EAPO_CACHE,
        eapo_path("models", "pretrained.json"),
        resources=resources_of("cpu_medium", runtime=240),
        params={"locked": eapo_locked("model", EAPO["pretrained"]["hub"])},
    ),
    stage(
        "download",
        script="download_math.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=eapo_path("raw", "{dataset}.parquet"),
        wildcards={"dataset": EAPO_WILDCARDS["dataset"]},
        log="download_{dataset}.log",
        params={
            "dataset": lambda wc: EAPO_MATH["datasets"][wc.dataset],
            "locked": lambda wc: eapo_locked("dataset", EAPO_MATH["datasets"][wc.dataset]["hub"]),
            "cache": EAPO_CACHE,
        },
    ),
    stage(
        "preprocess",
        script="preprocess_math.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={"raw": eapo_path("raw", "{dataset}.parquet"), "pretrained": eapo_path("models", "pretrained.json")},
        output=eapo_path("data", "{dataset}.parquet"),
        wildcards={"dataset": EAPO_WILDCARDS["dataset"]},
        log="preprocess_{dataset}.log",
        params={
            "template": lambda wc: EAPO_MATH["prompt_template"],  # a function: its {problem} is no wildcard
            "max_prompt_length": EAPO_MATH["max_prompt_length"],
        },
    ),
    stage(
        "train_prior",
        script="train_math.py",
        env="lm",  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
        threads=8,
        resources=eapo_train_resources("grpo"),
        priority=20,  # every injecting arm waits for pi_E
        input={"start": eapo_path("models", "pretrained.json"), "train": EAPO_TRAIN_SET},
        output={
            "model": eapo_path("models", "prior.json"),
            "history": eapo_path("models", "prior_history.csv"),
            "rollouts": eapo_path("models", "prior_rollouts.csv"),
        },
        benchmark=True,
        params={
            "settings": {
                **{k: EAPO[k] for k in ("pretrained", "math", "eapo")},
                "rl": {**EAPO["rl"], "lr": EAPO["prior"]["lr"]},
            },
            "method": "grpo",
            "seed": EAPO["prior"]["seed"],
            "steps": EAPO["prior"]["steps"],
            "processes": EAPO_TRAIN_GPUS,
        },
    ),
    stage(
        "train",
        script="train_math.py",
        env="lm",  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
        threads=8,
        resources=eapo_train_resources(),
        unpack=eapo_paper_start,
        input={"train": EAPO_TRAIN_SET},
        output={
            "model": eapo_path("models", "{method}", "seed{seed}.json"),
            "history": eapo_path("models", "{method}", "seed{seed}_history.csv"),
            "rollouts": eapo_path("models", "{method}", "seed{seed}_rollouts.csv"),
        },
        wildcards={"method": EAPO_WILDCARDS["trl_method"], "seed": EAPO_WILDCARDS["seed"]},
        tag="{method}_seed{seed}",
        benchmark=True,
        params={
            "settings": {k: EAPO[k] for k in ("pretrained", "math", "rl", "eapo")},
            "method": lambda wc: wc.method,
            "seed": lambda wc: int(wc.seed),
            "steps": None,
            "processes": EAPO_TRAIN_GPUS,
        },
    ),
    stage(
        "evaluate",
        script="evaluate_math.py",
        env="lm",  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
        threads=4,
        resources=heavy_resources("infer_gpu", EAPO, stage="evaluate"),
        input={
            **keyed("bench", {b: eapo_path("data", f"{b}.parquet") for b in EAPO_BENCH}),
            "model": eapo_path("models", "{method}", "seed{seed}.json"),
        },
        output=eapo_path("eval", "{method}", "seed{seed}.parquet"),
        wildcards={"method": EAPO_WILDCARDS["method"], "seed": EAPO_WILDCARDS["seed"]},
        tag="{method}_seed{seed}",
        benchmark=True,
        params={
            "ks": {b: EAPO_MATH["datasets"][b]["k"] for b in EAPO_BENCH},
            "evaluation": EAPO_MATH["evaluation"],
            "device": EAPO["pretrained"]["device"],
            "dtype": EAPO["pretrained"]["dtype"],
            "stop_tokens": EAPO_MATH["rollout"]["stop_tokens"],
        },
    ),
    stage(
        "report",
        script="report_math.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=keyed(
            "eval", {(m, s): eapo_path("eval", m, f"seed{s}.parquet") for m in EAPO["methods"] for s in EAPO["seeds"]}
        ),
        output={
            "report": eapo_path("report.md"),
            "metrics": eapo_path("metrics.json"),
            "table": report(eapo_path("tables", "avg_at_k.csv"), category="eapo", labels={"table": "avg@k"}),
        },
        reads=["pretrained"],
        params={"benchmarks": EAPO_BENCH, "ks": {b: EAPO_MATH["datasets"][b]["k"] for b in EAPO_BENCH}},
    ),
    # --- dapo and luffy: the authors' verl recipes (paperflow.eapo.recipes) ---------------------------------------
    stage(
        "download_recipes",
        script="download_recipes.py",
        env="lm",
        resources=resources_of("cpu_light", runtime=60),
        output=eapo_path("recipes", "source.json"),
        params={"repos": EAPO_RECIPES["repos"] if EAPO_RECIPES else None, "cache": EAPO_CACHE},
    ),
    stage(
        "recipe_data",
        script="recipe_data.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
            "train": EAPO_TRAIN_SET,
            "validation": eapo_path("data", f"{EAPO_RECIPES['validation'] if EAPO_RECIPES else 'none'}.parquet"),
        },
        output={
            "dapo_train": eapo_path("recipes", "dapo_train.parquet"),
            "validation": eapo_path("recipes", "validation.parquet"),
            "luffy_validation": eapo_path("recipes", "luffy_validation.parquet"),
        },
        params={"template": lambda wc: EAPO_MATH["prompt_template"]},  # a function: its {problem} is no wildcard
    ),
    stage(
        "prior_traces",
        script="prior_traces.py",
        env="lm",  # + math-verify (the proposed envs/lm.yaml line, workflows/eapo/README.md)
        threads=4,
        resources=heavy_resources("infer_gpu", EAPO, stage="evaluate"),
        input={"prior": eapo_path("models", "prior.json"), "train": EAPO_TRAIN_SET},
        output=eapo_path("models", "prior_traces.parquet"),
        benchmark=True,
        params={
            "samples": EAPO_RECIPES["luffy"]["trace_samples"] if EAPO_RECIPES else None,
            "evaluation": EAPO_MATH["evaluation"],
            "device": EAPO["pretrained"]["device"],
            "dtype": EAPO["pretrained"]["dtype"],
            "stop_tokens": EAPO_MATH["rollout"]["stop_tokens"],
        },
    ),
    stage(
        "luffy_data",
        script="luffy_data.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={"train": EAPO_TRAIN_SET, "traces": eapo_path("models", "prior_traces.parquet")},
        output=eapo_path("recipes", "luffy_train.parquet"),
        params={"template": lambda wc: EAPO_MATH["prompt_template"]},
    ),
    stage(
        "train_dapo",
        script="train_recipe.py",
        env="lm-verl",  # verl 0.9.1 (+ vLLM 0.24, math-verify): the DAPO recipe's trainer and model merger
        threads=16,
        resources=heavy_resources("train_node_gpu", EAPO, stage="train"),
        input={
            "start": eapo_path("models", "pretrained.json"),
            "recipes": eapo_path("recipes", "source.json"),
            "train": eapo_path("recipes", "dapo_train.parquet"),
            "validation": eapo_path("recipes", "validation.parquet"),
        },
        output={"model": eapo_path("models", "dapo", "seed{seed}.json")},
        wildcards={"seed": EAPO_WILDCARDS["seed"]},
        tag="dapo_seed{seed}",
        log_dir="train",
        benchmark=True,
        params={
            "method": "dapo",
            "seed": lambda wc: int(wc.seed),
            "settings": {k: EAPO[k] for k in ("pretrained", "math", "rl", "resources")},
        },
    ),
    stage(
        "train_luffy",
        script="train_recipe.py",
        env="lm-verl-luffy",  # LUFFY's own stack; its verl fork comes from the checkout (PYTHONPATH)
        threads=16,
        resources=heavy_resources("train_node_gpu", EAPO, stage="train"),
        input={
            "start": eapo_path("models", "pretrained.json"),
            "recipes": eapo_path("recipes", "source.json"),
            "train": eapo_path("recipes", "luffy_train.parquet"),
            "validation": eapo_path("recipes", "luffy_validation.parquet"),
        },
        output={"model": eapo_path("models", "luffy", "seed{seed}.json")},
        wildcards={"seed": EAPO_WILDCARDS["seed"]},
        tag="luffy_seed{seed}",
        log_dir="train",
        benchmark=True,
        params={
            "method": "luffy",
            "seed": lambda wc: int(wc.seed),
            "settings": {k: EAPO[k] for k in ("pretrained", "math", "rl", "resources")},
        },
    ),
)
