# confu at tiny and smoke scale (source.kind synthetic): the digit world, a tiny target trained per seed, the draft
# heads and tree decoding on the CPU. Included by the Snakefile.


rule confu_download:
    output:
        confu_path("raw", "problems.parquet"),
    log:
        confu_path("logs", "download.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=CONFU["source"],
        data=CONFU["data"],
        code=code_param("lm", "workflows/confu/scripts/download.py"),
    script:
        "scripts/download.py"


rule confu_preprocess:
    input:
        confu_path("raw", "problems.parquet"),
    output:
        confu_path("data", "vocabulary.json"),
    log:
        confu_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        data=CONFU["data"],
        code=code_param("lm", "workflows/confu/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule confu_train_target:
    input:
        problems=confu_path("raw", "problems.parquet"),
        vocabulary=confu_path("data", "vocabulary.json"),
    output:
        checkpoint=confu_path("models", "target_seed{seed}.safetensors"),
        history=confu_path("models", "target_history_seed{seed}.csv"),
        data=confu_path("data", "draft_seed{seed}.safetensors"),
        references=confu_path("eval", "references_seed{seed}.parquet"),
    log:
        confu_path("logs", "train_target", "seed{seed}.log"),
    benchmark:
        confu_path("benchmarks", "train_target_seed{seed}.tsv")
    wildcard_constraints:
        seed=str(CONFU_TARGET_SEED),
    priority: 20  # every draft waits for the target
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", CONFU, stage="train"),
    params:
        data=CONFU["data"],
        target=CONFU["target"],
        seeds=CONFU_SEEDS,
        n_prompts=CONFU["draft"]["n_prompts"],
        references=CONFU_REFERENCES,
        code=code_param("lm", "workflows/confu/scripts/train_target.py"),
    script:
        "scripts/train_target.py"


rule confu_train:
    input:
        unpack(confu_train_inputs),
    output:
        checkpoints=confu_heads("{method}"),
        history=confu_path("models", "{method}", "history.csv"),
    log:
        confu_path("logs", "train", "{method}.log"),
    benchmark:
        confu_path("benchmarks", "train_{method}.tsv")
    wildcard_constraints:
        method="|".join(CONFU_METHODS),
    priority: 10
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", CONFU, stage="train"),
    params:
        seeds=CONFU_SEEDS,
        data=CONFU["data"],
        target=CONFU["target"],
        draft=CONFU["draft"],
        confu=CONFU["confu"],
        code=code_param("lm", "workflows/confu/scripts/train.py"),
    script:
        "scripts/train.py"


rule confu_evaluate:
    input:
        unpack(confu_evaluate_inputs),
    output:
        confu_path("eval", "{method}.parquet"),
    log:
        confu_path("logs", "evaluate", "{method}.log"),
    benchmark:
        confu_path("benchmarks", "evaluate_{method}.tsv")
    wildcard_constraints:
        method="|".join(CONFU_METHODS),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", CONFU, stage="evaluate"),
    params:
        seeds=CONFU_SEEDS,
        data=CONFU["data"],
        target=CONFU["target"],
        draft=CONFU["draft"],
        decoding=CONFU["decoding"],
        code=code_param("lm", "workflows/confu/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule confu_report:
    input:
        **confu_lm_report_inputs(),
        evals=expand(confu_path("eval", "{method}.parquet"), method=CONFU_METHODS),
        histories=[confu_path("models", f"target_history_seed{CONFU_TARGET_SEED}.csv")],
        draft_histories=expand(confu_path("models", "{method}", "history.csv"), method=CONFU_METHODS),
    output:
        report=confu_path("report.md"),
        metrics=confu_path("metrics.json"),
        metrics_table=confu_path("metrics.parquet"),
        table_tau=report(confu_path("tables", "tau.csv"), category="confu", labels={"table": "acceptance length"}),
        table_depth=report(
            confu_path("tables", "per_depth.csv"), category="confu", labels={"table": "per-depth acceptance"}
        ),
        figure_tau=report(confu_path("figures", "tau.png"), category="confu", labels={"figure": "tau per method"}),
        figure_depth=report(
            confu_path("figures", "per_depth.png"), category="confu", labels={"figure": "per-depth acceptance"}
        ),
    log:
        confu_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=CONFU_METHODS,
        seeds=CONFU_SEEDS,
        decoding=CONFU["decoding"],
        draft=CONFU["draft"],
        claims=CONFU["claims"],
        claims_not_measured=CONFU["claims_not_measured"],
        pretrained_cpu=CONFU["pretrained_cpu"],
        scale=RUN.scale,
        code=code_param("lm", "workflows/confu/scripts/report.py"),
    script:
        "scripts/report.py"
