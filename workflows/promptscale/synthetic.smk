# promptscale at tiny and smoke scale (source.kind designer_world): the synthetic designer world, cold start and EM
# of the tiny q and p per seed, the no-rationale model, synthesis, the solvers and the report.
PROMPTSCALE_TRAIN = {k: PROMPTSCALE[k] for k in ("model", "coldstart", "em")}


rule promptscale_download:
    output:
        promptscale_path("raw", "items.parquet"),
    log:
        promptscale_path("logs", "download.log"),
    conda:
        env_file("lm")  # the designer world's package reaches the kit's tokenizer (imported lazily)
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=PROMPTSCALE["source"],
        world=PROMPTSCALE["world"],
        code=code_param("lm", "workflows/promptscale/scripts/download.py"),
    script:
        "scripts/download.py"


rule promptscale_preprocess:
    input:
        promptscale_path("raw", "items.parquet"),
    output:
        triples=promptscale_path("data", "triples.parquet"),
        vocabulary=promptscale_path("data", "vocabulary.json"),
    log:
        promptscale_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        annotator=PROMPTSCALE["annotator"],
        code=code_param("lm", "workflows/promptscale/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule promptscale_train:
    input:
        problems=promptscale_path("raw", "items.parquet"),
        triples=promptscale_path("data", "triples.parquet"),
        vocabulary=promptscale_path("data", "vocabulary.json"),
    output:
        **promptscale_seed_outputs("{seed}"),
    log:
        promptscale_path("logs", "train", "seed{seed}.log"),
    benchmark:
        promptscale_path("benchmarks", "train_seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    # one job per seed: both EM variants start from the seed's cold-start models (a process start costs as much
    # as one EM iteration)
    priority: 10
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", PROMPTSCALE, stage="train"),
    params:
        settings=PROMPTSCALE_TRAIN,
        variants=PROMPTSCALE["variants"],
        code=code_param("lm", "workflows/promptscale/scripts/train.py"),
    script:
        "scripts/train.py"


rule promptscale_train_direct:
    input:
        problems=promptscale_path("raw", "items.parquet"),
        triples=promptscale_path("data", "triples.parquet"),
        vocabulary=promptscale_path("data", "vocabulary.json"),
    output:
        promptscale_path("models", "direct", "seed{seed}.safetensors"),
        history=promptscale_path("models", "direct", "seed{seed}_history.csv"),
    log:
        promptscale_path("logs", "train_direct", "seed{seed}.log"),
    benchmark:
        promptscale_path("benchmarks", "train_direct_seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", PROMPTSCALE, stage="train"),
    params:
        settings=PROMPTSCALE_TRAIN,
        code=code_param("lm", "workflows/promptscale/scripts/train_direct.py"),
    script:
        "scripts/train_direct.py"


rule promptscale_solver:
    input:
        problems=promptscale_path("raw", "items.parquet"),
        vocabulary=promptscale_path("data", "vocabulary.json"),
        synthesised=promptscale_path("eval", "synthesised.parquet"),
    output:
        accuracy=promptscale_path("solver", "seed{seed}.csv"),
        dpo=promptscale_path("solver", "dpo_seed{seed}.csv"),
    log:
        promptscale_path("logs", "solver", "seed{seed}.log"),
    benchmark:
        promptscale_path("benchmarks", "solver_seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", PROMPTSCALE, stage="train"),
    params:
        model=PROMPTSCALE["model"],
        solver=PROMPTSCALE["solver"],
        selfplay=lambda wc: int(wc.seed) in PROMPTSCALE["report_seeds"],  # self-play DPO (report only) there
        code=code_param("lm", "workflows/promptscale/scripts/solver.py"),
    script:
        "scripts/solver.py"


rule promptscale_evaluate:
    input:
        unpack(promptscale_prompt_models),
        problems=promptscale_path("raw", "items.parquet"),
    output:
        metrics=promptscale_path("eval", "synthesis.csv"),
        synthesised=promptscale_path("eval", "synthesised.parquet"),
    log:
        promptscale_path("logs", "evaluate.log"),
    benchmark:
        promptscale_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="evaluate"),
    params:
        synthesis=PROMPTSCALE["synthesis"],
        code=code_param("lm", "workflows/promptscale/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule promptscale_report:
    input:
        unpack(promptscale_report_inputs),
        synthesis=promptscale_path("eval", "synthesis.csv"),
        triples=promptscale_path("data", "triples.parquet"),
    output:
        report=promptscale_path("report.md"),
        metrics=promptscale_path("metrics.json"),
        metrics_table=promptscale_path("metrics.parquet"),
        table_em=report(promptscale_path("tables", "em.csv"), category="promptscale", labels={"table": "EM curves"}),
        table_synthesis=report(
            promptscale_path("tables", "synthesis.csv"), category="promptscale", labels={"table": "synthesis"}
        ),
        figure_em=report(promptscale_path("figures", "em.png"), category="promptscale", labels={"figure": "EM"}),
    log:
        promptscale_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=PROMPTSCALE["seeds"],
        report_seeds=PROMPTSCALE["report_seeds"],
        variants=PROMPTSCALE["variants"],
        em=PROMPTSCALE["em"],
        annotator=PROMPTSCALE["annotator"],
        solver=PROMPTSCALE["solver"],
        scale=RUN.scale,
        claims=PROMPTSCALE["claims"],
        claims_not_measured=PROMPTSCALE["claims_not_measured"],
        code=code_param("lm", "workflows/promptscale/scripts/report.py"),
    script:
        "scripts/report.py"
