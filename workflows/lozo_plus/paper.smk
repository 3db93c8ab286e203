# lozo_plus at paper scale (source.kind superglue): the pretrained model (`pretrained`) downloaded once and each task
# of `tasks` at its pinned Hub commit (config, else config/locks/lozo_plus.json, written by `paperflow pin
# lozo_plus`), MeZO's samples and templates, and the ZO methods and the first-order reference per (task, method,
# seed), on the GPUs resources.train_gpus_by_model gives the (model, method): one, or several with the model sharded.
from paperflow.core.download import read_lock_revisions
from paperflow.lozo_plus.sharding import gpus_for

LOZO_PLUS_TASKS = list(LOZO_PLUS["tasks"])
LOZO_PLUS_CACHE = f"{RUN.resources}/lozo_plus"
LOZO_PLUS_LOCK = read_lock_revisions("lozo_plus", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns

LOZO_PLUS_HUB = LOZO_PLUS["pretrained"]["hub"]
# GPUs of a train job per (model, method) from resources.train_gpus_by_model: one-GPU methods run in
# lozo_plus_train (class train_gpu), the others in lozo_plus_train_node (class train_node_gpu, the model sharded)
LOZO_PLUS_GPUS = {m: gpus_for(LOZO_PLUS["resources"], LOZO_PLUS_HUB, m) for m in LOZO_PLUS["methods"]}
LOZO_PLUS_EVAL_GPUS = gpus_for(LOZO_PLUS["resources"], LOZO_PLUS_HUB, None, stage="evaluate")
LOZO_PLUS_NONE = "(?!x)x"  # a wildcard pattern that matches nothing

LOZO_PLUS_WILDCARDS = {
    "task": "|".join(LOZO_PLUS_TASKS),
    "method": "|".join(LOZO_PLUS["methods"]),
    "group": r"s[0-9]+",
}
# a train job's inputs and outputs, on one GPU (train) or several (train_node)
LOZO_PLUS_TRAIN_INPUT = {
    "pretrained": lozo_plus_path("models", "pretrained.json"),
    "train": lozo_plus_path("data", "{task}", "train.parquet"),
}
LOZO_PLUS_TRAIN_OUTPUT = {
    "models": temp(lozo_plus_path("runs", "{task}", "{method}", "{group}", "models.safetensors")),
    "curve": lozo_plus_path("runs", "{task}", "{method}", "{group}", "curve.csv"),
    "log": lozo_plus_path("runs", "{task}", "{method}", "{group}", "log.csv"),
    "align": lozo_plus_path("runs", "{task}", "{method}", "{group}", "align.csv"),
    "summary": lozo_plus_path("runs", "{task}", "{method}", "{group}", "summary.csv"),
}
LOZO_PLUS_TRAIN_PARAMS = {
    "temporary": ["models"],  # its temp() output: the record marks it, the audit accepts it deleted
    "seeds": lozo_plus_seeds_of_group,
    "gpus": lambda wc: LOZO_PLUS_GPUS[wc.method],
}


paper_stages(
    "lozo_plus",
    LOZO_PLUS,
    lozo_plus_path,
    stage(
        "download_model",
        script="download_model.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=240),
        output=lozo_plus_path("models", "pretrained.json"),
        reads=["pretrained"],
        params={"locked": lozo_plus_locked("model", LOZO_PLUS["pretrained"]["hub"]), "cache": LOZO_PLUS_CACHE},
    ),
    stage(
        "download",
        script="download_task.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output={
            "train": lozo_plus_path("raw", "{task}", "train.parquet"),
            "validation": lozo_plus_path("raw", "{task}", "validation.parquet"),
        },
        wildcards={"task": LOZO_PLUS_WILDCARDS["task"]},
        log="download_{task}.log",
        params={
            "dataset": lozo_plus_dataset,
            "locked": lambda wc: lozo_plus_locked("dataset", LOZO_PLUS["tasks"][wc.task]["hub"]),
            "cache": LOZO_PLUS_CACHE,
        },
    ),
    stage(
        "preprocess",
        script="preprocess_task.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "train": lozo_plus_path("raw", "{task}", "train.parquet"),
            "validation": lozo_plus_path("raw", "{task}", "validation.parquet"),
            "pretrained": lozo_plus_path("models", "pretrained.json"),
        },
        output={
            "train": lozo_plus_path("data", "{task}", "train.parquet"),
            "dev": lozo_plus_path("data", "{task}", "dev.parquet"),
            "test": lozo_plus_path("data", "{task}", "test.parquet"),
        },
        wildcards={"task": LOZO_PLUS_WILDCARDS["task"]},
        log="preprocess_{task}.log",
        reads=["data"],
        params={
            "dev": lambda wc: LOZO_PLUS["tasks"][wc.task]["dev"],
            "max_length": LOZO_PLUS["pretrained"]["max_length"],
        },
    ),
    # a train job on one GPU
    stage(
        "train",
        script="train_pretrained.py",
        env="lm",
        resources=heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
        input=LOZO_PLUS_TRAIN_INPUT,
        output=LOZO_PLUS_TRAIN_OUTPUT,
        wildcards=dict(LOZO_PLUS_WILDCARDS, method=lozo_plus_methods_on(False)),
        tag="{task}_{method}_{group}",
        benchmark=True,
        reads=["pretrained", "run", "zo", "lr", "ft"],
        params=LOZO_PLUS_TRAIN_PARAMS,
        threads=4,
    ),
    # a train job on several GPUs of one node: the model sharded over them (device_map auto), one process
    stage(
        "train_node",
        script="train_pretrained.py",
        env="lm",
        resources=heavy_resources("train_node_gpu", LOZO_PLUS, gpus=lambda wc: LOZO_PLUS_GPUS[wc.method]),
        input=LOZO_PLUS_TRAIN_INPUT,
        output=LOZO_PLUS_TRAIN_OUTPUT,
        wildcards=dict(LOZO_PLUS_WILDCARDS, method=lozo_plus_methods_on(True)),
        tag="{task}_{method}_{group}",
        log_dir="train",
        benchmark=True,
        reads=["pretrained", "run", "zo", "lr", "ft"],
        params=LOZO_PLUS_TRAIN_PARAMS,
        threads=4,
    ),
    stage(
        "evaluate",
        script="evaluate_pretrained.py",
        env="lm",
        resources=heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate", gpus=LOZO_PLUS_EVAL_GPUS),
        input={
            "pretrained": lozo_plus_path("models", "pretrained.json"),
            "models": lozo_plus_path("runs", "{task}", "{method}", "{group}", "models.safetensors"),
            "dev": lozo_plus_path("data", "{task}", "dev.parquet"),
            "test": lozo_plus_path("data", "{task}", "test.parquet"),
        },
        output=lozo_plus_path("eval", "{task}", "{method}_{group}.parquet"),
        wildcards=LOZO_PLUS_WILDCARDS,
        tag="{task}_{method}_{group}",
        benchmark=True,
        reads=["pretrained"],
        params={
            "seeds": lozo_plus_seeds_of_group,
            "gpus": LOZO_PLUS_EVAL_GPUS,
            "max_new_tokens": lozo_plus_max_new_tokens,
        },
        threads=4,
    ),
    stage(
        "report",
        script="report_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            **keyed(
                "eval",
                {
                    (t, m, g): lozo_plus_path("eval", t, f"{m}_{g}.parquet")
                    for t in LOZO_PLUS_TASKS
                    for m, g in lozo_plus_runs()
                },
            ),
            **lozo_plus_paper_files("curve", "csv"),
            **lozo_plus_paper_files("summary", "csv"),
        },
        output={
            "report": lozo_plus_path("report.md"),
            "metrics": lozo_plus_path("metrics.json"),
            "metrics_table": lozo_plus_path("metrics.parquet"),
            "table_tasks": report(
                lozo_plus_path("tables", "tasks.csv"), category="lozo_plus", labels={"table": "accuracy per task"}
            ),
            "figure_loss": report(
                lozo_plus_path("figures", "loss_vs_forwards.png"),
                category="lozo_plus",
                labels={"figure": "train loss vs forward passes"},
            ),
        },
        reads=["methods", "seeds", "pretrained", "run", "lr", "ft", "claims", "claims_not_measured"],
        params={"tasks": LOZO_PLUS_TASKS, "scale": RUN.scale},
    ),
)
