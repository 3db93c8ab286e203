# specflow at smoke and tiny scale (source.kind synthetic): seeded counting scenes -> patch-object covers -> the
# stand-in VLM per seed -> every pruning method -> report. Included by workflows/specflow/Snakefile.
from paperflow.specflow.settings import GATED as SPECFLOW_GATED_METHODS

SPECFLOW_SEEDS = SPECFLOW["seeds"]
SPECFLOW_METHODS = SPECFLOW["methods"]
SPECFLOW_GATED = [m for m in SPECFLOW_GATED_METHODS if m in SPECFLOW_METHODS]
SPECFLOW_REPORT_ONLY = [m for m in SPECFLOW_METHODS if m not in SPECFLOW_GATED]


paper_stages(
    "specflow",
    SPECFLOW,
    specflow_path,
    stage(
        "download",
        script="download.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=specflow_path("raw", "scenes.npz"),
        reads=["source", "data"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=specflow_path("raw", "scenes.npz"),
        output=specflow_path("data", "count.npz"),
        reads=["data"],
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", SPECFLOW, stage="train"),
        input=specflow_path("data", "count.npz"),
        output={
            "checkpoint": specflow_path("models", "seed{seed}.safetensors"),
            "tokens": specflow_path("tokens", "seed{seed}.npz"),
            "history": specflow_path("models", "history_seed{seed}.csv"),
        },
        wildcards={"seed": r"\d+"},
        tag="seed{seed}",
        benchmark=True,
        reads=["data", "encoder", "reader", "train", "ratios"],
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", SPECFLOW, stage="evaluate"),
        input={
            "data": specflow_path("data", "count.npz"),
            "checkpoints": [specflow_path("models", f"seed{s}.safetensors") for s in SPECFLOW_SEEDS],
            "tokens": [specflow_path("tokens", f"seed{s}.npz") for s in SPECFLOW_SEEDS],
        },
        output=specflow_path("eval", "{method}.csv"),
        wildcards={"method": "|".join(SPECFLOW_GATED) or "^$"},
        tag="{method}",
        benchmark=True,
        reads=["seeds", "data", "reader", "specflow", "ratios"],
    ),
    stage(
        # the report-only methods in one job: each is seconds of numpy, and a process start (torch) costs as much;
        # a cluster profile can still run them apart by listing them among the gated ones
        "evaluate_report_only",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", SPECFLOW, stage="evaluate"),
        input={
            "data": specflow_path("data", "count.npz"),
            "checkpoints": [specflow_path("models", f"seed{s}.safetensors") for s in SPECFLOW_SEEDS],
            "tokens": [specflow_path("tokens", f"seed{s}.npz") for s in SPECFLOW_SEEDS],
        },
        output=[specflow_path("eval", f"{m}.csv") for m in SPECFLOW_REPORT_ONLY],
        log_dir="evaluate",
        tag="report_only",
        benchmark=True,
        reads=["seeds", "data", "reader", "specflow", "ratios"],
        params={"methods": SPECFLOW_REPORT_ONLY},
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "evals": expand(specflow_path("eval", "{method}.csv"), method=SPECFLOW_METHODS),
            "histories": [specflow_path("models", f"history_seed{s}.csv") for s in SPECFLOW_SEEDS],
        },
        output={
            "report": specflow_path("report.md"),
            "metrics": specflow_path("metrics.json"),
            "metrics_table": specflow_path("metrics.parquet"),
            "table_relative": report(
                specflow_path("tables", "relative.csv"), category="specflow", labels={"table": "relative accuracy"}
            ),
            "table_table1": report(
                specflow_path("tables", "table1_average.csv"),
                category="specflow",
                labels={"table": "Table 1 average"},
            ),
            "figure_retention": report(
                specflow_path("figures", "retention.png"), category="specflow", labels={"figure": "retention vs ratio"}
            ),
            "figure_coverage": report(
                specflow_path("figures", "coverage.png"), category="specflow", labels={"figure": "object coverage"}
            ),
        },
        reads=["methods", "seeds", "ratios", "report_ratio", "claims", "claims_not_measured"],
        params={
            "reader_layers": SPECFLOW["reader"]["layers"],
            "fastv_layer": SPECFLOW["reader"]["fastv_layer"],  # set by the config's defaults block
            "scale": RUN.scale,
        },
    ),
)
