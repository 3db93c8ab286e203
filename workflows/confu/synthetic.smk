# confu at tiny and smoke scale (source.kind synthetic): the digit world, a tiny target trained per seed, the draft
# heads and tree decoding on the CPU. Included by the Snakefile.


paper_stages(
    "confu",
    CONFU,
    confu_path,
    stage(
        "download",
        script="download.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=confu_path("raw", "problems.parquet"),
        reads=["source", "data"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=confu_path("raw", "problems.parquet"),
        output=confu_path("data", "vocabulary.json"),
        reads=["data"],
    ),
    stage(
        "train_target",
        script="train_target.py",
        env="lm",
        resources=heavy_resources("train_gpu", CONFU, stage="train"),
        input={
            "problems": confu_path("raw", "problems.parquet"),
            "vocabulary": confu_path("data", "vocabulary.json"),
        },
        output={
            "checkpoint": confu_path("models", "target_seed{seed}.safetensors"),
            "history": confu_path("models", "target_history_seed{seed}.csv"),
            "data": confu_path("data", "draft_seed{seed}.safetensors"),
            "references": confu_path("eval", "references_seed{seed}.parquet"),
        },
        wildcards={"seed": str(CONFU_TARGET_SEED)},
        tag="seed{seed}",
        benchmark=True,
        reads=["data", "target", "seeds"],
        params={"n_prompts": CONFU["draft"]["n_prompts"], "references": CONFU_REFERENCES},
        priority=20,  # every draft waits for the target
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", CONFU, stage="train"),
        unpack=confu_train_inputs,
        output={
            "checkpoints": confu_heads("{method}"),
            "history": confu_path("models", "{method}", "history.csv"),
        },
        wildcards={"method": "|".join(CONFU_METHODS)},
        tag="{method}",
        benchmark=True,
        reads=["seeds", "data", "target", "draft", "confu"],
        priority=10,
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", CONFU, stage="evaluate"),
        unpack=confu_evaluate_inputs,
        output=confu_path("eval", "{method}.parquet"),
        wildcards={"method": "|".join(CONFU_METHODS)},
        tag="{method}",
        benchmark=True,
        reads=["seeds", "data", "target", "draft", "decoding"],
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            **confu_lm_report_inputs(),
            "evals": expand(confu_path("eval", "{method}.parquet"), method=CONFU_METHODS),
            "histories": [confu_path("models", f"target_history_seed{CONFU_TARGET_SEED}.csv")],
            "draft_histories": expand(confu_path("models", "{method}", "history.csv"), method=CONFU_METHODS),
        },
        output={
            "report": confu_path("report.md"),
            "metrics": confu_path("metrics.json"),
            "metrics_table": confu_path("metrics.parquet"),
            "table_tau": report(
                confu_path("tables", "tau.csv"), category="confu", labels={"table": "acceptance length"}
            ),
            "table_depth": report(
                confu_path("tables", "per_depth.csv"), category="confu", labels={"table": "per-depth acceptance"}
            ),
            "figure_tau": report(
                confu_path("figures", "tau.png"), category="confu", labels={"figure": "tau per method"}
            ),
            "figure_depth": report(
                confu_path("figures", "per_depth.png"), category="confu", labels={"figure": "per-depth acceptance"}
            ),
        },
        reads=["methods", "seeds", "decoding", "draft", "claims", "claims_not_measured", "pretrained_cpu"],
        params={"scale": RUN.scale},
    ),
)
