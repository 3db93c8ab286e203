# promptscale at tiny and smoke scale (source.kind designer_world): the synthetic designer world, cold start and EM
# of the tiny q and p per seed, the no-rationale model, synthesis, the solvers and the report.
PROMPTSCALE_TRAIN = {k: PROMPTSCALE[k] for k in ("model", "coldstart", "em")}


paper_stages(
    "promptscale",
    PROMPTSCALE,
    promptscale_path,
    stage(
        "download",
        script="download.py",
        env="lm",  # the designer world's package reaches the kit's tokenizer (imported lazily)
        resources=resources_of("cpu_light"),
        output=promptscale_path("raw", "items.parquet"),
        reads=["source", "world"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=promptscale_path("raw", "items.parquet"),
        output={
            "triples": promptscale_path("data", "triples.parquet"),
            "vocabulary": promptscale_path("data", "vocabulary.json"),
        },
        reads=["annotator"],
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", PROMPTSCALE, stage="train"),
        input={
            "problems": promptscale_path("raw", "items.parquet"),
            "triples": promptscale_path("data", "triples.parquet"),
            "vocabulary": promptscale_path("data", "vocabulary.json"),
        },
        output=promptscale_seed_outputs("{seed}"),
        wildcards={"seed": r"\d+"},
        tag="seed{seed}",
        benchmark=True,
        # one job per seed: both EM variants start from the seed's cold-start models (a process start costs as much
        # as one EM iteration)
        priority=10,
        reads=["variants"],
        params={"settings": PROMPTSCALE_TRAIN},
    ),
    stage(
        "solver",
        script="solver.py",
        env="lm",
        resources=heavy_resources("train_gpu", PROMPTSCALE, stage="train"),
        input={
            "problems": promptscale_path("raw", "items.parquet"),
            "vocabulary": promptscale_path("data", "vocabulary.json"),
            "synthesised": promptscale_path("eval", "synthesised.parquet"),
        },
        output={
            "accuracy": promptscale_path("solver", "seed{seed}.csv"),
            "dpo": promptscale_path("solver", "dpo_seed{seed}.csv"),
        },
        wildcards={"seed": r"\d+"},
        tag="seed{seed}",
        benchmark=True,
        reads=["model", "solver"],
        params={
            "selfplay": lambda wc: int(wc.seed) in PROMPTSCALE["report_seeds"],  # self-play DPO (report only) there
        },
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="evaluate"),
        unpack=promptscale_prompt_models,
        input={"problems": promptscale_path("raw", "items.parquet")},
        output={
            "metrics": promptscale_path("eval", "synthesis.csv"),
            "synthesised": promptscale_path("eval", "synthesised.parquet"),
        },
        benchmark=True,
        reads=["synthesis"],
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=promptscale_report_inputs,
        input={
            "synthesis": promptscale_path("eval", "synthesis.csv"),
            "triples": promptscale_path("data", "triples.parquet"),
        },
        output={
            "report": promptscale_path("report.md"),
            "metrics": promptscale_path("metrics.json"),
            "metrics_table": promptscale_path("metrics.parquet"),
            "table_em": report(
                promptscale_path("tables", "em.csv"), category="promptscale", labels={"table": "EM curves"}
            ),
            "table_synthesis": report(
                promptscale_path("tables", "synthesis.csv"), category="promptscale", labels={"table": "synthesis"}
            ),
            "figure_em": report(promptscale_path("figures", "em.png"), category="promptscale", labels={"figure": "EM"}),
        },
        reads=[
            "seeds",
            "report_seeds",
            "variants",
            "em",
            "annotator",
            "solver",
            "claims",
            "claims_not_measured",
        ],
        params={"scale": RUN.scale},
    ),
    stage(
        "train_direct",
        script="train_direct.py",
        env="lm",
        resources=heavy_resources("train_gpu", PROMPTSCALE, stage="train"),
        input={
            "problems": promptscale_path("raw", "items.parquet"),
            "triples": promptscale_path("data", "triples.parquet"),
            "vocabulary": promptscale_path("data", "vocabulary.json"),
        },
        # the script writes job.output[0]: the model file stays positional, its history named
        output=[
            promptscale_path("models", "direct", "seed{seed}.safetensors"),
            {"history": promptscale_path("models", "direct", "seed{seed}_history.csv")},
        ],
        wildcards={"seed": r"\d+"},
        tag="seed{seed}",
        benchmark=True,
        params={"settings": PROMPTSCALE_TRAIN},
    ),
)
