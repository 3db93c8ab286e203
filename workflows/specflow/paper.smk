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


def specflow_locked(repo_type, hub):
    return SPECFLOW_LOCK.get(f"{repo_type}:{hub}")


def specflow_answers(wildcards):
    """The answers files of every (method, budget) job on one benchmark, keyed (method, budget)."""
    return keyed(
        "answers",
        {(m, k): specflow_path("answers", wildcards.benchmark, f"{m}_k{k}.parquet") for m, k in SPECFLOW_JOBS},
    )


rule specflow_download_model:
    output:
        specflow_path("models", "pretrained.json"),
    log:
        specflow_path("logs", "download_model.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        pretrained=SPECFLOW["pretrained"],
        locked=specflow_locked("model", SPECFLOW["pretrained"]["hub"]),
        cache=SPECFLOW_CACHE,
        code=code_param("lm", "workflows/specflow/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule specflow_download:
    output:
        specflow_path("raw", "{benchmark}.parquet"),
    log:
        specflow_path("logs", "download_{benchmark}.log"),
    wildcard_constraints:
        benchmark=SPECFLOW_WILDCARDS["benchmark"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        bench=lambda wc: SPECFLOW["benchmarks"][wc.benchmark],
        locked=lambda wc: specflow_locked("dataset", SPECFLOW["benchmarks"][wc.benchmark]["hub"]),
        cache=SPECFLOW_CACHE,
        code=code_param("lm", "workflows/specflow/scripts/download_benchmark.py"),
    script:
        "scripts/download_benchmark.py"


rule specflow_evaluate:
    input:
        pretrained=specflow_path("models", "pretrained.json"),
        questions=specflow_path("raw", "{benchmark}.parquet"),
    output:
        specflow_path("answers", "{benchmark}", "{method}_k{budget}.parquet"),
    log:
        specflow_path("logs", "evaluate", "{benchmark}_{method}_k{budget}.log"),
    benchmark:
        specflow_path("benchmarks", "evaluate_{benchmark}_{method}_k{budget}.tsv")
    wildcard_constraints:
        **SPECFLOW_WILDCARDS,
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", SPECFLOW, stage="evaluate"),
    params:
        pretrained=SPECFLOW["pretrained"],
        specflow=SPECFLOW["specflow"],
        seeds=SPECFLOW["seeds"],
        code=code_param("lm", "workflows/specflow/scripts/evaluate_llava.py"),
    script:
        "scripts/evaluate_llava.py"


rule specflow_score:
    input:
        unpack(specflow_answers),
    output:
        specflow_path("scores", "{benchmark}.csv"),
    log:
        specflow_path("logs", "score_{benchmark}.log"),
    wildcard_constraints:
        benchmark=SPECFLOW_WILDCARDS["benchmark"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("lm", "workflows/specflow/scripts/score.py"),
    script:
        "scripts/score.py"


rule specflow_report:
    input:
        scores=expand(specflow_path("scores", "{benchmark}.csv"), benchmark=SPECFLOW_BENCHMARKS),
    output:
        report=specflow_path("report.md"),
        metrics=specflow_path("metrics.json"),
        metrics_table=specflow_path("metrics.parquet"),
        table_relative=report(
            specflow_path("tables", "relative.csv"), category="specflow", labels={"table": "relative score"}
        ),
        table_scores=report(
            specflow_path("tables", "scores.csv"), category="specflow", labels={"table": "benchmark scores"}
        ),
        figure_relative=report(
            specflow_path("figures", "relative.png"), category="specflow", labels={"figure": "relative vs tokens"}
        ),
    log:
        specflow_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        pretrained=SPECFLOW["pretrained"],
        methods=SPECFLOW["methods"],
        ratios=SPECFLOW["ratios"],
        seeds=SPECFLOW["seeds"],
        report_ratio=SPECFLOW["report_ratio"],
        scale=RUN.scale,
        claims=SPECFLOW["claims"],
        claims_not_measured=SPECFLOW["claims_not_measured"],
        code=code_param("lm", "workflows/specflow/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
