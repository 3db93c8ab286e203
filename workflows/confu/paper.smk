# confu at paper scale (source.kind specbench): each target of `targets` and each prompt set of `datasets` at its
# pinned Hub commit (config, else config/locks/confu.json, written by `paperflow pin confu`), Spec-Bench at its
# pinned sha256; per target the chat-template prompts, its greedy responses to the training prompts (one GPU per
# shard), the drafts on one node's GPUs (torchrun), target-only and speculative decoding at batch 1 on one GPU each.
from paperflow.core.download import read_lock_revisions

CONFU_TARGETS = list(CONFU["targets"])
CONFU_DATASETS = list(CONFU["datasets"])
CONFU_SHARDS = list(range(CONFU["prompts"]["shards"]))
CONFU_CACHE = f"{RUN.resources}/confu"
CONFU_LOCK = read_lock_revisions("confu", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
CONFU_WILDCARDS = {
    "target": "|".join(CONFU_TARGETS),
    "method": "|".join(CONFU_METHODS),
    "dataset": "|".join(CONFU_DATASETS),
    "shard": r"\d+",
}


paper_stages(
    "confu",
    CONFU,
    confu_path,
    # Llama-3 is gated: huggingface_hub reads the token from HF_TOKEN (or `hf auth login`)
    hub_model_stage(
        "confu",
        "download_model",
        spec=lambda wc: CONFU["targets"][wc.target],
        key=lambda wc: f"targets.{wc.target}.revision",
        cache=CONFU_CACHE,
        extra=lambda wc: {"target": wc.target},
        output=confu_path("models", "{target}", "pretrained.json"),
        resources=resources_of("cpu_medium", runtime=240),
        wildcards={"target": CONFU_WILDCARDS["target"]},
        log="download_model_{target}.log",
        params={"locked": lambda wc: confu_locked("model", CONFU["targets"][wc.target]["hub"])},
    ),
    stage(
        "download",
        script="download_dataset.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=240),
        output=confu_path("raw", "{dataset}.parquet"),
        wildcards={"dataset": CONFU_WILDCARDS["dataset"]},
        log="download_{dataset}.log",
        params={
            "dataset": lambda wc: CONFU["datasets"][wc.dataset],
            "locked": lambda wc: confu_locked("dataset", CONFU["datasets"][wc.dataset]["hub"]),
            "cache": CONFU_CACHE,
        },
    ),
    stage(
        "download_benchmark",
        script="download_benchmark.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=confu_path("raw", "specbench_questions.parquet"),
        reads=["benchmark"],
        params={"cache": CONFU_CACHE},
    ),
    stage(
        "preprocess",
        script="preprocess_paper.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
            "pretrained": confu_path("models", "{target}", "pretrained.json"),
            "train": expand(confu_path("raw", "{dataset}.parquet"), dataset=CONFU_DATASETS),
            "test": confu_path("raw", "specbench_questions.parquet"),
        },
        output={
            "train": confu_path("data", "{target}", "train_prompts.parquet"),
            "test": confu_path("data", "{target}", "test_prompts.parquet"),
        },
        wildcards={"target": CONFU_WILDCARDS["target"]},
        log="preprocess_{target}.log",
        reads=["prompts"],
        threads=4,
    ),
    stage(
        "regenerate",
        script="regenerate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", CONFU, stage="regenerate"),
        input={
            "pretrained": confu_path("models", "{target}", "pretrained.json"),
            "train": confu_path("data", "{target}", "train_prompts.parquet"),
        },
        output=confu_path("data", "{target}", "draft_shard{shard}.safetensors"),
        wildcards={"target": CONFU_WILDCARDS["target"], "shard": CONFU_WILDCARDS["shard"]},
        tag="{target}_shard{shard}",
        benchmark=True,
        reads=["regenerate"],
        params={"target": lambda wc: CONFU["targets"][wc.target]},
        threads=4,
    ),
    stage(
        "train",
        script="train_paper.py",
        env="lm",
        resources=heavy_resources("train_node_gpu", CONFU, stage="train"),
        unpack=confu_paper_train_inputs,
        output={
            "head": confu_path("models", "{target}", "{method}.safetensors"),
            "history": confu_path("models", "{target}", "{method}_history.csv"),
            "spec": confu_path("models", "{target}", "{method}_spec.json"),
        },
        wildcards={"target": CONFU_WILDCARDS["target"], "method": CONFU_WILDCARDS["method"]},
        tag="{target}_{method}",
        benchmark=True,
        reads=["seeds", "draft", "confu", "regenerate"],
        params={
            "target": lambda wc: CONFU["targets"][wc.target],
            "processes": CONFU["resources"]["gpus"],
        },
        threads=8,
    ),
    stage(
        "evaluate_plain",
        script="evaluate_plain.py",
        env="lm",
        resources=heavy_resources("infer_gpu", CONFU, stage="evaluate"),
        input={
            "pretrained": confu_path("models", "{target}", "pretrained.json"),
            "test": confu_path("data", "{target}", "test_prompts.parquet"),
        },
        output=confu_path("eval", "{target}", "plain.parquet"),
        wildcards={"target": CONFU_WILDCARDS["target"]},
        tag="{target}_plain",
        log_dir="evaluate",
        benchmark=True,
        reads=["decoding"],
        params={"target": lambda wc: CONFU["targets"][wc.target]},
        threads=4,
    ),
    stage(
        "evaluate",
        script="evaluate_paper.py",
        env="lm",
        resources=heavy_resources("infer_gpu", CONFU, stage="evaluate"),
        input={
            "pretrained": confu_path("models", "{target}", "pretrained.json"),
            "head": confu_path("models", "{target}", "{method}.safetensors"),
            "test": confu_path("data", "{target}", "test_prompts.parquet"),
            "plain": confu_path("eval", "{target}", "plain.parquet"),
        },
        output=confu_path("eval", "{target}", "{method}.parquet"),
        wildcards={"target": CONFU_WILDCARDS["target"], "method": CONFU_WILDCARDS["method"]},
        tag="{target}_{method}",
        benchmark=True,
        reads=["seeds", "decoding"],
        params={"target": lambda wc: CONFU["targets"][wc.target]},
        threads=4,
    ),
    stage(
        "report",
        script="report_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "evals": expand(
                confu_path("eval", "{target}", "{method}.parquet"), target=CONFU_TARGETS, method=CONFU_METHODS
            ),
            "plain": expand(confu_path("eval", "{target}", "plain.parquet"), target=CONFU_TARGETS),
        },
        output={
            "report": confu_path("report.md"),
            "metrics": confu_path("metrics.json"),
            "metrics_table": confu_path("metrics.parquet"),
            "table_tau": report(
                confu_path("tables", "tau.csv"), category="confu", labels={"table": "tau, speed-up, lossless"}
            ),
            "figure_tau": report(
                confu_path("figures", "tau.png"), category="confu", labels={"figure": "tau per method"}
            ),
        },
        reads=["targets", "methods", "seeds", "decoding", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)
