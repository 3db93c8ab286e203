# specflow at paper scale (source.kind llava): LLaVA-1.5-7B (`pretrained`) downloaded once and each benchmark of
# `benchmarks` at its pinned Hub commit (config, else config/locks/specflow.json, written by `paperflow pin specflow`);
# LLaVA's answers per (method, budget, benchmark) on one GPU each, the vision tokens condensed between the projector
# and the language model; the scores per benchmark and the report on CPU.
from paperflow.core.download import read_lock_revisions
from paperflow.specflow.paper import jobs as specflow_paper_jobs

SPECFLOW_BENCHMARKS = list(SPECFLOW["benchmarks"])
SPECFLOW_JOBS = specflow_paper_jobs(SPECFLOW)
SPECFLOW_CACHE = f"{RUN.resources}/specflow"
SPECFLOW_LOCK = read_lock_revisions("specflow", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
SPECFLOW_WILDCARDS = {
    "benchmark": "|".join(SPECFLOW_BENCHMARKS),
    "method": "|".join(SPECFLOW["methods"]),
    "budget": r"[0-9]+",
}


paper_stages(
    "specflow",
    SPECFLOW,
    specflow_path,
    hub_model_stage(
        "specflow",
        "download_model",
        SPECFLOW["pretrained"],
        "pretrained.revision",
        SPECFLOW_CACHE,
        specflow_path("models", "pretrained.json"),
        resources=resources_of("cpu_medium", runtime=240),
        params={"locked": specflow_locked("model", SPECFLOW["pretrained"]["hub"])},
    ),
    stage(
        "download",
        script="download_benchmark.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=specflow_path("raw", "{benchmark}.parquet"),
        wildcards={"benchmark": SPECFLOW_WILDCARDS["benchmark"]},
        log="download_{benchmark}.log",
        params={
            "bench": lambda wc: SPECFLOW["benchmarks"][wc.benchmark],
            "locked": lambda wc: specflow_locked("dataset", SPECFLOW["benchmarks"][wc.benchmark]["hub"]),
            "cache": SPECFLOW_CACHE,
        },
    ),
    stage(
        "evaluate",
        script="evaluate_llava.py",
        env="lm",
        resources=heavy_resources("infer_gpu", SPECFLOW, stage="evaluate"),
        input={
            "pretrained": specflow_path("models", "pretrained.json"),
            "questions": specflow_path("raw", "{benchmark}.parquet"),
        },
        output=specflow_path("answers", "{benchmark}", "{method}_k{budget}.parquet"),
        wildcards=SPECFLOW_WILDCARDS,
        tag="{benchmark}_{method}_k{budget}",
        benchmark=True,
        threads=4,
        reads=["pretrained", "specflow", "seeds"],
    ),
    stage(
        "score",
        script="score.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=specflow_answers,
        output=specflow_path("scores", "{benchmark}.csv"),
        wildcards={"benchmark": SPECFLOW_WILDCARDS["benchmark"]},
        log="score_{benchmark}.log",
    ),
    stage(
        "report",
        script="report_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={"scores": expand(specflow_path("scores", "{benchmark}.csv"), benchmark=SPECFLOW_BENCHMARKS)},
        output={
            "report": specflow_path("report.md"),
            "metrics": specflow_path("metrics.json"),
            "metrics_table": specflow_path("metrics.parquet"),
            "table_relative": report(
                specflow_path("tables", "relative.csv"), category="specflow", labels={"table": "relative score"}
            ),
            "table_scores": report(
                specflow_path("tables", "scores.csv"), category="specflow", labels={"table": "benchmark scores"}
            ),
            "figure_relative": report(
                specflow_path("figures", "relative.png"), category="specflow", labels={"figure": "relative vs tokens"}
            ),
        },
        reads=["pretrained", "methods", "ratios", "seeds", "report_ratio", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)
