# itpo at smoke and tiny scale (source.kind synthetic): the ask-then-answer tutoring environment, SFT of the
# initial policy, RL per method and seed group, evaluation, the turn analysis and the report.


rule itpo_download:
    output:
        eval_tasks=itpo_path("raw", "eval_tasks.parquet"),
        analysis_tasks=itpo_path("raw", "analysis_tasks.parquet"),
    log:
        itpo_path("logs", "download.log"),
    conda:
        env_file("lm")  # the environment module reaches the kit's tokenizer and sampler (torch, transformers)
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=ITPO["source"],
        task=ITPO["task"],
        code=code_param("lm", "workflows/itpo/scripts/download.py"),
    script:
        "scripts/download.py"


rule itpo_preprocess:
    input:
        itpo_path("raw", "eval_tasks.parquet"),
    output:
        vocabulary=itpo_path("data", "vocabulary.json"),
    log:
        itpo_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("lm", "workflows/itpo/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule itpo_sft_init:
    input:
        vocabulary=itpo_path("data", "vocabulary.json"),
        eval_tasks=itpo_path("raw", "eval_tasks.parquet"),
    output:
        checkpoint=itpo_path("models", "init.safetensors"),
        history=itpo_path("models", "init_history.csv"),
    log:
        itpo_path("logs", "sft_init.log"),
    benchmark:
        itpo_path("benchmarks", "sft_init.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", ITPO, stage="train"),
    params:
        model=ITPO["model"],
        sft=ITPO["sft"],
        code=code_param("lm", "workflows/itpo/scripts/sft_init.py"),
    script:
        "scripts/sft_init.py"


rule itpo_train:
    input:
        init=itpo_path("models", "init.safetensors"),
        eval_tasks=itpo_path("raw", "eval_tasks.parquet"),
    output:
        checkpoints=itpo_path("models", "{method}", "{group}.safetensors"),
        curves=itpo_path("models", "{method}", "{group}_curves.csv"),
    log:
        itpo_path("logs", "train", "{method}_{group}.log"),
    benchmark:
        itpo_path("benchmarks", "train_{method}_{group}.tsv")
    wildcard_constraints:
        method=ITPO_WILDCARDS["method"],
        group=ITPO_WILDCARDS["group"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", ITPO, stage="train"),
    params:
        rl=ITPO["rl"],
        seeds=lambda wc: ITPO_GROUPS[wc.group],
        code=code_param("lm", "workflows/itpo/scripts/train.py"),
    script:
        "scripts/train.py"


rule itpo_evaluate:
    input:
        unpack(itpo_policies),
        eval_tasks=itpo_path("raw", "eval_tasks.parquet"),
    output:
        itpo_path("eval", "final.parquet"),
    log:
        itpo_path("logs", "evaluate.log"),
    benchmark:
        itpo_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", ITPO, stage="evaluate"),
    params:
        code=code_param("lm", "workflows/itpo/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule itpo_turn_analysis:
    input:
        unpack(itpo_analysis_inputs),
        init=itpo_path("models", "init.safetensors"),
        analysis_tasks=itpo_path("raw", "analysis_tasks.parquet"),
    output:
        itpo_path("analysis", "turns.parquet"),
    log:
        itpo_path("logs", "turn_analysis.log"),
    benchmark:
        itpo_path("benchmarks", "turn_analysis.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", ITPO, stage="evaluate"),
    params:
        analysis=ITPO["analysis"],
        beta=ITPO["rl"]["beta"],
        code=code_param("lm", "workflows/itpo/scripts/turn_analysis.py"),
    script:
        "scripts/turn_analysis.py"


rule itpo_report:
    input:
        unpack(itpo_curves),
        final=itpo_path("eval", "final.parquet"),
        turns=itpo_path("analysis", "turns.parquet"),
        init_history=itpo_path("models", "init_history.csv"),
    output:
        report=itpo_path("report.md"),
        metrics=itpo_path("metrics.json"),
        metrics_table=itpo_path("metrics.parquet"),
        table_runs=report(itpo_path("tables", "runs.csv"), category="itpo", labels={"table": "per method and seed"}),
        table_turns=report(itpo_path("tables", "turns.csv"), category="itpo", labels={"table": "turns by action"}),
        figure_success=report(itpo_path("figures", "success.png"), category="itpo", labels={"figure": "success"}),
        figure_turn_scores=report(
            itpo_path("figures", "turn_scores.png"), category="itpo", labels={"figure": "turn scores"}
        ),
        figure_volatility=report(
            itpo_path("figures", "volatility.png"), category="itpo", labels={"figure": "advantage volatility"}
        ),
    log:
        itpo_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=ITPO["methods"],
        seeds=ITPO["seeds"],
        sft=ITPO["sft"],
        analysis_ci=ITPO["analysis_ci"],
        scale=RUN.scale,
        claims=ITPO["claims"],
        claims_not_measured=ITPO["claims_not_measured"],
        control_methods=ITPO["rl"]["control_methods"],
        code=code_param("lm", "workflows/itpo/scripts/report.py"),
    script:
        "scripts/report.py"
