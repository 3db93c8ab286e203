# doubt at smoke and tiny scale (source.kind synthetic): grid scenes, the tiny LLaVA-style VLM per seed, its answer
# sets, MiniLM embeddings, the detectors, evaluation and the claims' report. Included by workflows/doubt/Snakefile.


paper_stages(
    "doubt",
    DOUBT,
    doubt_path,
    stage(
        "download",
        script="download.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=doubt_path("raw", "scenes.parquet"),
        reads=["source", "data"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=doubt_path("raw", "scenes.parquet"),
        output={
            "vocabulary": doubt_path("data", "vocabulary.json"),
            "clusterer": doubt_path("data", "clusterer.json"),
        },
        reads=["embedding"],
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", DOUBT, stage="train"),
        priority=10,
        input={
            "scenes": doubt_path("raw", "scenes.parquet"),
            "vocabulary": doubt_path("data", "vocabulary.json"),
        },
        output={
            "checkpoint": doubt_path("models", "seed{seed}.safetensors"),
            "history": doubt_path("models", "seed{seed}_history.csv"),
        },
        wildcards={"seed": r"\d+"},
        tag="seed{seed}",
        benchmark=True,
        reads=["model", "train"],
        params={"temperature": DOUBT["sampling"]["temperature"]},
    ),
    stage(
        "sample",
        script="sample.py",
        env="lm",
        resources=heavy_resources("infer_gpu", DOUBT, stage="sample"),
        input={
            "scenes": doubt_path("raw", "scenes.parquet"),
            "checkpoint": doubt_path("models", "seed{seed}.safetensors"),
        },
        output=doubt_path("samples", "seed{seed}.parquet"),
        wildcards={"seed": r"\d+"},
        tag="seed{seed}",
        benchmark=True,
        reads=["sampling"],
    ),
    stage(
        "embed",
        script="embed.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=doubt_samples,
        output=doubt_path("data", "embeddings.parquet"),
        reads=["embedding"],
    ),
    stage(
        "score",
        script="score.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=doubt_samples,
        input={
            "embeddings": doubt_path("data", "embeddings.parquet"),
            "clusterer": doubt_path("data", "clusterer.json"),
        },
        output=doubt_path("scores", "{method}.parquet"),
        wildcards={"method": "|".join(DOUBT["methods"])},
        tag="{method}",
        reads=["scoring"],
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=doubt_evaluate_inputs,
        input={
            "scenes": doubt_path("raw", "scenes.parquet"),
            "embeddings": doubt_path("data", "embeddings.parquet"),
            "clusterer": doubt_path("data", "clusterer.json"),
        },
        output={
            "metrics": doubt_path("eval", "metrics.parquet"),
            "per_item": doubt_path("eval", "items.parquet"),
        },
        benchmark=True,
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "metrics": doubt_path("eval", "metrics.parquet"),
            "per_item": doubt_path("eval", "items.parquet"),
            "clusterer": doubt_path("data", "clusterer.json"),
        },
        output={
            "report": doubt_path("report.md"),
            "metrics": doubt_path("metrics.json"),
            "metrics_table": doubt_path("metrics.parquet"),
            "table_detectors": report(
                doubt_path("tables", "detectors.csv"), category="doubt", labels={"table": "detectors"}
            ),
            "figure_auroc": report(
                doubt_path("figures", "auroc.png"), category="doubt", labels={"figure": "AUROC vs n"}
            ),
        },
        reads=["seeds", "sampling", "scoring", "train", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)
