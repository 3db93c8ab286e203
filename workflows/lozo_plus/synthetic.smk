# lozo_plus at smoke and tiny scale: the generated polarity task and a tiny Llama pretrained on its source task.


LOZO_PLUS_SPLITS = ("train", "dev", "test", "source_test")
LOZO_PLUS_WILDCARDS = {"method": "|".join(LOZO_PLUS["methods"]), "group": r"s[0-9]+(-[0-9]+)*"}


paper_stages(
    "lozo_plus",
    LOZO_PLUS,
    lozo_plus_path,
    stage(
        "download",
        script="download.py",
        env="base",
        resources=resources_of("cpu_light"),
        output=lozo_plus_path("raw", "examples.parquet"),
        reads=["source", "data"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="base",
        resources=resources_of("cpu_light"),
        input=lozo_plus_path("raw", "examples.parquet"),
        output={s: lozo_plus_path("data", f"{s}.parquet") for s in LOZO_PLUS_SPLITS},
    ),
    stage(
        "pretrain",
        script="pretrain.py",
        env="lm",
        resources=heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
        input={
            "source_test": lozo_plus_path("data", "source_test.parquet"),
            "test": lozo_plus_path("data", "test.parquet"),
        },
        output={
            "checkpoint": lozo_plus_path("models", "source.safetensors"),
            "history": lozo_plus_path("models", "source_history.csv"),
        },
        benchmark=True,
        reads=["model", "pretrain"],
        priority=20,  # every fine-tuning run starts from it
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
        input={
            "source": lozo_plus_path("models", "source.safetensors"),
            "train": lozo_plus_path("data", "train.parquet"),
        },
        output={
            "models": lozo_plus_path("runs", "{method}", "{group}", "models.safetensors"),
            "curve": lozo_plus_path("runs", "{method}", "{group}", "curve.csv"),
            "log": lozo_plus_path("runs", "{method}", "{group}", "log.csv"),
            "align": lozo_plus_path("runs", "{method}", "{group}", "align.csv"),
        },
        wildcards=LOZO_PLUS_WILDCARDS,
        tag="{method}_{group}",
        benchmark=True,
        reads=["run", "zo", "lr", "ft"],
        params={"seeds": lozo_plus_seeds_of_group},
        priority=10,
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate"),
        input={
            **lozo_plus_run_files("models"),
            "source": lozo_plus_path("models", "source.safetensors"),
            "dev": lozo_plus_path("data", "dev.parquet"),
            "test": lozo_plus_path("data", "test.parquet"),
        },
        output=lozo_plus_path("eval", "final.parquet"),
        benchmark=True,
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            **lozo_plus_run_files("curve"),
            **lozo_plus_run_files("log"),
            **lozo_plus_run_files("align"),
            **lozo_plus_lm_report_inputs(),
            "final": lozo_plus_path("eval", "final.parquet"),
            "history": lozo_plus_path("models", "source_history.csv"),
        },
        output={
            **lozo_plus_lm_report_outputs(),
            "report": lozo_plus_path("report.md"),
            "metrics": lozo_plus_path("metrics.json"),
            "metrics_table": lozo_plus_path("metrics.parquet"),
            "table_methods": report(
                lozo_plus_path("tables", "methods.csv"), category="lozo_plus", labels={"table": "per method and seed"}
            ),
            "table_capture": report(
                lozo_plus_path("tables", "capture.csv"), category="lozo_plus", labels={"table": "capture ratio"}
            ),
            "figure_loss": report(
                lozo_plus_path("figures", "loss_vs_forwards.png"),
                category="lozo_plus",
                labels={"figure": "train loss vs forward passes"},
            ),
            "figure_capture": report(
                lozo_plus_path("figures", "capture.png"), category="lozo_plus", labels={"figure": "capture ratio"}
            ),
        },
        reads=[
            "methods",
            "seeds",
            "report_only",
            "report_seeds",
            "run",
            "zo",
            "lr",
            "pretrain",
            "pretrained_cpu",
            "claims",
            "claims_not_measured",
        ],
        params={"scale": RUN.scale},
    ),
)
