# uka at smoke and tiny scale (source.kind needworld): NeedWorld, the simulator the spec writes for CPU runs.

UKA_WILDCARDS = {
    "world": "|".join(uka_worlds()),
    "method": "|".join(sorted(set(UKA["methods"]) | set(UKA["control"]["methods"]))),
}
UKA_SIM = {k: UKA[k] for k in ("simulation", "training", "test", "agent")}


paper_stages(
    "uka",
    UKA,
    uka_path,
    stage(
        "download",
        script="download.py",
        env="base",
        resources=resources_of("cpu_light"),
        output={"world": uka_path("raw", "needworld.json"), "users": uka_path("raw", "users.parquet")},
        reads=["source", "seeds"],
        params={"simulation": UKA_SIM},
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",  # MiniLM through the kit's shared sentence-encoder loader
        resources=resources_of("cpu_light"),
        input={"world": uka_path("raw", "needworld.json")},
        output=uka_path("data", "embeddings.parquet"),
        benchmark=True,
        priority=20,  # every training job waits for the embeddings
        threads=2,
        reads=["embedding"],
    ),
    stage(
        "train",
        script="train.py",
        env="base",
        resources=heavy_resources("train_gpu", UKA, stage="train"),
        input={"users": uka_path("raw", "users.parquet"), "embeddings": uka_path("data", "embeddings.parquet")},
        output={
            "memory": uka_path("models", "{world}", "{method}", "memory.parquet"),
            "attempts": uka_path("models", "{world}", "{method}", "attempts.csv"),
        },
        wildcards={"world": UKA_WILDCARDS["world"], "method": UKA_WILDCARDS["method"]},
        tag="{world}_{method}",
        benchmark=True,
        reads=["seeds"],
        params={"settings": UKA_SIM},
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="base",
        resources=heavy_resources("infer_gpu", UKA, stage="evaluate"),
        unpack=uka_memory_input,
        input={"users": uka_path("raw", "users.parquet"), "embeddings": uka_path("data", "embeddings.parquet")},
        output={
            "per_user": uka_path("eval", "{world}", "{method}", "per_user.parquet"),
            "per_turn": uka_path("eval", "{world}", "{method}", "per_turn.parquet"),
        },
        wildcards={"world": UKA_WILDCARDS["world"], "method": UKA_WILDCARDS["method"]},
        tag="{world}_{method}",
        benchmark=True,
        reads=["seeds"],
        params={"settings": UKA_SIM},
    ),
    stage(
        "report",
        script="report.py",
        env="base",
        resources=resources_of("cpu_light"),
        unpack=uka_report_inputs,
        input={"world": uka_path("raw", "needworld.json"), "users": uka_path("raw", "users.parquet")},
        output={
            "report": uka_path("report.md"),
            "metrics": uka_path("metrics.json"),
            "metrics_table": uka_path("metrics.parquet"),
            "table_methods": report(uka_path("tables", "methods.csv"), category="uka", labels={"table": "methods"}),
            "figure_success": report(
                uka_path("figures", "success.png"), category="uka", labels={"figure": "success rate"}
            ),
            "figure_entropy": report(
                uka_path("figures", "entropy.png"), category="uka", labels={"figure": "belief entropy"}
            ),
            "figure_strategies": report(
                uka_path("figures", "strategies.png"), category="uka", labels={"figure": "strategy mix"}
            ),
        },
        reads=[
            "seeds",
            "control",
            "simulation",
            "training",
            "agent",
            "embedding",
            "claims",
            "claims_not_measured",
        ],
        params={"scale": RUN.scale},
    ),
)
