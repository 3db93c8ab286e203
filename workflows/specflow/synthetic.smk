# specflow at smoke and tiny scale (source.kind synthetic): seeded counting scenes -> patch-object covers -> the
# stand-in VLM per seed -> every pruning method -> report. Included by workflows/specflow/Snakefile.
from paperflow.specflow.settings import GATED as SPECFLOW_GATED_METHODS

SPECFLOW_SEEDS = SPECFLOW["seeds"]
SPECFLOW_METHODS = SPECFLOW["methods"]
SPECFLOW_GATED = [m for m in SPECFLOW_GATED_METHODS if m in SPECFLOW_METHODS]
SPECFLOW_REPORT_ONLY = [m for m in SPECFLOW_METHODS if m not in SPECFLOW_GATED]


rule specflow_download:
    output:
        specflow_path("raw", "scenes.npz"),
    log:
        specflow_path("logs", "download.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=SPECFLOW["source"],
        data=SPECFLOW["data"],
        code=code_param("lm", "workflows/specflow/scripts/download.py"),
    script:
        "scripts/download.py"


rule specflow_preprocess:
    input:
        specflow_path("raw", "scenes.npz"),
    output:
        specflow_path("data", "count.npz"),
    log:
        specflow_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        data=SPECFLOW["data"],
        code=code_param("lm", "workflows/specflow/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule specflow_train:
    input:
        specflow_path("data", "count.npz"),
    output:
        checkpoint=specflow_path("models", "seed{seed}.safetensors"),
        tokens=specflow_path("tokens", "seed{seed}.npz"),
        history=specflow_path("models", "history_seed{seed}.csv"),
    log:
        specflow_path("logs", "train", "seed{seed}.log"),
    benchmark:
        specflow_path("benchmarks", "train_seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", SPECFLOW, stage="train"),
    params:
        data=SPECFLOW["data"],
        encoder=SPECFLOW["encoder"],
        reader=SPECFLOW["reader"],
        train=SPECFLOW["train"],
        ratios=SPECFLOW["ratios"],
        code=code_param("lm", "workflows/specflow/scripts/train.py"),
    script:
        "scripts/train.py"


rule specflow_evaluate:
    input:
        data=specflow_path("data", "count.npz"),
        checkpoints=[specflow_path("models", f"seed{s}.safetensors") for s in SPECFLOW_SEEDS],
        tokens=[specflow_path("tokens", f"seed{s}.npz") for s in SPECFLOW_SEEDS],
    output:
        specflow_path("eval", "{method}.csv"),
    log:
        specflow_path("logs", "evaluate", "{method}.log"),
    benchmark:
        specflow_path("benchmarks", "evaluate_{method}.tsv")
    wildcard_constraints:
        method="|".join(SPECFLOW_GATED) or "^$",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", SPECFLOW, stage="evaluate"),
    params:
        seeds=SPECFLOW_SEEDS,
        data=SPECFLOW["data"],
        reader=SPECFLOW["reader"],
        specflow=SPECFLOW["specflow"],
        ratios=SPECFLOW["ratios"],
        code=code_param("lm", "workflows/specflow/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule specflow_evaluate_report_only:
    input:
        data=specflow_path("data", "count.npz"),
        checkpoints=[specflow_path("models", f"seed{s}.safetensors") for s in SPECFLOW_SEEDS],
        tokens=[specflow_path("tokens", f"seed{s}.npz") for s in SPECFLOW_SEEDS],
    output:
        [specflow_path("eval", f"{m}.csv") for m in SPECFLOW_REPORT_ONLY],
    log:
        specflow_path("logs", "evaluate", "report_only.log"),
    benchmark:
        specflow_path("benchmarks", "evaluate_report_only.tsv")
    # the report-only methods in one job: each is seconds of numpy, and a process start (torch) costs as much;
    # a cluster profile can still run them apart by listing them among the gated ones
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", SPECFLOW, stage="evaluate"),
    params:
        methods=SPECFLOW_REPORT_ONLY,
        seeds=SPECFLOW_SEEDS,
        data=SPECFLOW["data"],
        reader=SPECFLOW["reader"],
        specflow=SPECFLOW["specflow"],
        ratios=SPECFLOW["ratios"],
        code=code_param("lm", "workflows/specflow/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule specflow_report:
    input:
        evals=expand(specflow_path("eval", "{method}.csv"), method=SPECFLOW_METHODS),
        histories=[specflow_path("models", f"history_seed{s}.csv") for s in SPECFLOW_SEEDS],
    output:
        report=specflow_path("report.md"),
        metrics=specflow_path("metrics.json"),
        metrics_table=specflow_path("metrics.parquet"),
        table_relative=report(
            specflow_path("tables", "relative.csv"), category="specflow", labels={"table": "relative accuracy"}
        ),
        table_table1=report(
            specflow_path("tables", "table1_average.csv"), category="specflow", labels={"table": "Table 1 average"}
        ),
        figure_retention=report(
            specflow_path("figures", "retention.png"), category="specflow", labels={"figure": "retention vs ratio"}
        ),
        figure_coverage=report(
            specflow_path("figures", "coverage.png"), category="specflow", labels={"figure": "object coverage"}
        ),
    log:
        specflow_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=SPECFLOW_METHODS,
        seeds=SPECFLOW_SEEDS,
        ratios=SPECFLOW["ratios"],
        report_ratio=SPECFLOW["report_ratio"],
        reader_layers=SPECFLOW["reader"]["layers"],
        fastv_layer=SPECFLOW["reader"].get("fastv_layer", 1),
        scale=RUN.scale,
        claims=SPECFLOW["claims"],
        claims_not_measured=SPECFLOW["claims_not_measured"],
        code=code_param("lm", "workflows/specflow/scripts/report.py"),
    script:
        "scripts/report.py"
