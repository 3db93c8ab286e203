# doubt at smoke and tiny scale (source.kind synthetic): grid scenes, the tiny LLaVA-style VLM per seed, its answer
# sets, MiniLM embeddings, the detectors, evaluation and the claims' report. Included by workflows/doubt/Snakefile.


rule doubt_download:
    output:
        doubt_path("raw", "scenes.parquet"),
    log:
        doubt_path("logs", "download.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=DOUBT["source"],
        data=DOUBT["data"],
        code=code_param("lm", "workflows/doubt/scripts/download.py"),
    script:
        "scripts/download.py"


rule doubt_preprocess:
    input:
        doubt_path("raw", "scenes.parquet"),
    output:
        vocabulary=doubt_path("data", "vocabulary.json"),
        clusterer=doubt_path("data", "clusterer.json"),
    log:
        doubt_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        embedding=DOUBT["embedding"],
        code=code_param("lm", "workflows/doubt/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule doubt_train:
    input:
        scenes=doubt_path("raw", "scenes.parquet"),
        vocabulary=doubt_path("data", "vocabulary.json"),
    output:
        checkpoint=doubt_path("models", "seed{seed}.safetensors"),
        history=doubt_path("models", "seed{seed}_history.csv"),
    log:
        doubt_path("logs", "train", "seed{seed}.log"),
    benchmark:
        doubt_path("benchmarks", "train_seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    priority: 10
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", DOUBT, stage="train"),
    params:
        model=DOUBT["model"],
        train=DOUBT["train"],
        temperature=DOUBT["sampling"]["temperature"],
        code=code_param("lm", "workflows/doubt/scripts/train.py"),
    script:
        "scripts/train.py"


rule doubt_sample:
    input:
        scenes=doubt_path("raw", "scenes.parquet"),
        checkpoint=doubt_path("models", "seed{seed}.safetensors"),
    output:
        doubt_path("samples", "seed{seed}.parquet"),
    log:
        doubt_path("logs", "sample", "seed{seed}.log"),
    benchmark:
        doubt_path("benchmarks", "sample_seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", DOUBT, stage="sample"),
    params:
        sampling=DOUBT["sampling"],
        code=code_param("lm", "workflows/doubt/scripts/sample.py"),
    script:
        "scripts/sample.py"


rule doubt_embed:
    input:
        unpack(doubt_samples),
    output:
        doubt_path("data", "embeddings.parquet"),
    log:
        doubt_path("logs", "embed.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        embedding=DOUBT["embedding"],
        code=code_param("lm", "workflows/doubt/scripts/embed.py"),
    script:
        "scripts/embed.py"


rule doubt_score:
    input:
        unpack(doubt_samples),
        embeddings=doubt_path("data", "embeddings.parquet"),
        clusterer=doubt_path("data", "clusterer.json"),
    output:
        doubt_path("scores", "{method}.parquet"),
    log:
        doubt_path("logs", "score", "{method}.log"),
    wildcard_constraints:
        method="|".join(DOUBT["methods"]),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        scoring=DOUBT["scoring"],
        code=code_param("lm", "workflows/doubt/scripts/score.py"),
    script:
        "scripts/score.py"


rule doubt_evaluate:
    input:
        unpack(doubt_samples),
        unpack(doubt_scores),
        scenes=doubt_path("raw", "scenes.parquet"),
        embeddings=doubt_path("data", "embeddings.parquet"),
        clusterer=doubt_path("data", "clusterer.json"),
    output:
        metrics=doubt_path("eval", "metrics.parquet"),
        per_item=doubt_path("eval", "items.parquet"),
    log:
        doubt_path("logs", "evaluate.log"),
    benchmark:
        doubt_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("lm", "workflows/doubt/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule doubt_report:
    input:
        metrics=doubt_path("eval", "metrics.parquet"),
        per_item=doubt_path("eval", "items.parquet"),
        clusterer=doubt_path("data", "clusterer.json"),
    output:
        report=doubt_path("report.md"),
        metrics=doubt_path("metrics.json"),
        metrics_table=doubt_path("metrics.parquet"),
        table_detectors=report(doubt_path("tables", "detectors.csv"), category="doubt", labels={"table": "detectors"}),
        figure_auroc=report(doubt_path("figures", "auroc.png"), category="doubt", labels={"figure": "AUROC vs n"}),
    log:
        doubt_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=DOUBT["seeds"],
        sampling=DOUBT["sampling"],
        scoring=DOUBT["scoring"],
        train=DOUBT["train"],
        scale=RUN.scale,
        claims=DOUBT["claims"],
        claims_not_measured=DOUBT["claims_not_measured"],
        code=code_param("lm", "workflows/doubt/scripts/report.py"),
    script:
        "scripts/report.py"
