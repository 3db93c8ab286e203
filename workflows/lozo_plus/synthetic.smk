# lozo_plus at smoke and tiny scale: the generated polarity task and a tiny Llama pretrained on its source task.


LOZO_PLUS_SPLITS = ("train", "dev", "test", "source_test")
LOZO_PLUS_WILDCARDS = {"method": "|".join(LOZO_PLUS["methods"]), "group": r"s[0-9]+(-[0-9]+)*"}


rule lozo_plus_download:
    output:
        lozo_plus_path("raw", "examples.parquet"),
    log:
        lozo_plus_path("logs", "download.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=LOZO_PLUS["source"],
        data=LOZO_PLUS["data"],
        code=code_param("base", "workflows/lozo_plus/scripts/download.py"),
    script:
        "scripts/download.py"


rule lozo_plus_preprocess:
    input:
        lozo_plus_path("raw", "examples.parquet"),
    output:
        **{s: lozo_plus_path("data", f"{s}.parquet") for s in LOZO_PLUS_SPLITS},
    log:
        lozo_plus_path("logs", "preprocess.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("base", "workflows/lozo_plus/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule lozo_plus_pretrain:
    input:
        source_test=lozo_plus_path("data", "source_test.parquet"),
        test=lozo_plus_path("data", "test.parquet"),
    output:
        checkpoint=lozo_plus_path("models", "source.safetensors"),
        history=lozo_plus_path("models", "source_history.csv"),
    log:
        lozo_plus_path("logs", "pretrain.log"),
    benchmark:
        lozo_plus_path("benchmarks", "pretrain.tsv")
    priority: 20  # every fine-tuning run starts from it
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
    params:
        model=LOZO_PLUS["model"],
        pretrain=LOZO_PLUS["pretrain"],
        code=code_param("lm", "workflows/lozo_plus/scripts/pretrain.py"),
    script:
        "scripts/pretrain.py"


rule lozo_plus_train:
    input:
        source=lozo_plus_path("models", "source.safetensors"),
        train=lozo_plus_path("data", "train.parquet"),
    output:
        models=lozo_plus_path("runs", "{method}", "{group}", "models.safetensors"),
        curve=lozo_plus_path("runs", "{method}", "{group}", "curve.csv"),
        log=lozo_plus_path("runs", "{method}", "{group}", "log.csv"),
        align=lozo_plus_path("runs", "{method}", "{group}", "align.csv"),
    log:
        lozo_plus_path("logs", "train", "{method}_{group}.log"),
    benchmark:
        lozo_plus_path("benchmarks", "train_{method}_{group}.tsv")
    wildcard_constraints:
        method=LOZO_PLUS_WILDCARDS["method"],
        group=LOZO_PLUS_WILDCARDS["group"],
    priority: 10
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
    params:
        seeds=lozo_plus_seeds_of_group,
        run=LOZO_PLUS["run"],
        zo=LOZO_PLUS["zo"],
        lr=LOZO_PLUS["lr"],
        ft=LOZO_PLUS["ft"],
        code=code_param("lm", "workflows/lozo_plus/scripts/train.py"),
    script:
        "scripts/train.py"


rule lozo_plus_evaluate:
    input:
        **lozo_plus_run_files("models"),
        source=lozo_plus_path("models", "source.safetensors"),
        dev=lozo_plus_path("data", "dev.parquet"),
        test=lozo_plus_path("data", "test.parquet"),
    output:
        lozo_plus_path("eval", "final.parquet"),
    log:
        lozo_plus_path("logs", "evaluate.log"),
    benchmark:
        lozo_plus_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate"),
    params:
        code=code_param("lm", "workflows/lozo_plus/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule lozo_plus_report:
    input:
        **lozo_plus_run_files("curve"),
        **lozo_plus_run_files("log"),
        **lozo_plus_run_files("align"),
        **lozo_plus_lm_report_inputs(),
        final=lozo_plus_path("eval", "final.parquet"),
        history=lozo_plus_path("models", "source_history.csv"),
    output:
        **lozo_plus_lm_report_outputs(),
        report=lozo_plus_path("report.md"),
        metrics=lozo_plus_path("metrics.json"),
        metrics_table=lozo_plus_path("metrics.parquet"),
        table_methods=report(
            lozo_plus_path("tables", "methods.csv"), category="lozo_plus", labels={"table": "per method and seed"}
        ),
        table_capture=report(
            lozo_plus_path("tables", "capture.csv"), category="lozo_plus", labels={"table": "capture ratio"}
        ),
        figure_loss=report(
            lozo_plus_path("figures", "loss_vs_forwards.png"),
            category="lozo_plus",
            labels={"figure": "train loss vs forward passes"},
        ),
        figure_capture=report(
            lozo_plus_path("figures", "capture.png"), category="lozo_plus", labels={"figure": "capture ratio"}
        ),
    log:
        lozo_plus_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=LOZO_PLUS["methods"],
        seeds=LOZO_PLUS["seeds"],
        report_only=LOZO_PLUS["report_only"],
        report_seeds=LOZO_PLUS["report_seeds"],
        run=LOZO_PLUS["run"],
        zo=LOZO_PLUS["zo"],
        lr=LOZO_PLUS["lr"],
        pretrain=LOZO_PLUS["pretrain"],
        pretrained_cpu=LOZO_PLUS["pretrained_cpu"],
        scale=RUN.scale,
        claims=LOZO_PLUS["claims"],
        claims_not_measured=LOZO_PLUS["claims_not_measured"],
        code=code_param("lm", "workflows/lozo_plus/scripts/report.py"),
    script:
        "scripts/report.py"
