# uka at smoke and tiny scale (source.kind needworld): NeedWorld, the simulator the spec writes for CPU runs.

UKA_WILDCARDS = {
    "world": "|".join(uka_worlds()),
    "method": "|".join(sorted(set(UKA["methods"]) | set(UKA["control"]["methods"]))),
}
UKA_SIM = {k: UKA[k] for k in ("simulation", "training", "test", "agent")}


rule uka_download:
    output:
        world=uka_path("raw", "needworld.json"),
        users=uka_path("raw", "users.parquet"),
    log:
        uka_path("logs", "download.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=UKA["source"],
        simulation=UKA_SIM,
        seeds=UKA["seeds"],
        code=code_param("base", "workflows/uka/scripts/download.py"),
    script:
        "scripts/download.py"


rule uka_preprocess:
    input:
        world=uka_path("raw", "needworld.json"),
    output:
        uka_path("data", "embeddings.parquet"),
    log:
        uka_path("logs", "preprocess.log"),
    benchmark:
        uka_path("benchmarks", "preprocess.tsv")
    priority: 20  # every training job waits for the embeddings
    conda:
        env_file("lm")  # MiniLM through the kit's shared sentence-encoder loader
    threads: 2
    resources:
        **resources_of("cpu_light"),
    params:
        embedding=UKA["embedding"],
        code=code_param("lm", "workflows/uka/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule uka_train:
    input:
        users=uka_path("raw", "users.parquet"),
        embeddings=uka_path("data", "embeddings.parquet"),
    output:
        memory=uka_path("models", "{world}", "{method}", "memory.parquet"),
        attempts=uka_path("models", "{world}", "{method}", "attempts.csv"),
    log:
        uka_path("logs", "train", "{world}_{method}.log"),
    benchmark:
        uka_path("benchmarks", "train_{world}_{method}.tsv")
    wildcard_constraints:
        world=UKA_WILDCARDS["world"],
        method=UKA_WILDCARDS["method"],
    conda:
        env_file("base")
    threads: 1
    resources:
        **heavy_resources("train_gpu", UKA, stage="train"),
    params:
        settings=UKA_SIM,
        seeds=UKA["seeds"],
        code=code_param("base", "workflows/uka/scripts/train.py"),
    script:
        "scripts/train.py"


rule uka_evaluate:
    input:
        unpack(uka_memory_input),
        users=uka_path("raw", "users.parquet"),
        embeddings=uka_path("data", "embeddings.parquet"),
    output:
        per_user=uka_path("eval", "{world}", "{method}", "per_user.parquet"),
        per_turn=uka_path("eval", "{world}", "{method}", "per_turn.parquet"),
    log:
        uka_path("logs", "evaluate", "{world}_{method}.log"),
    benchmark:
        uka_path("benchmarks", "evaluate_{world}_{method}.tsv")
    wildcard_constraints:
        world=UKA_WILDCARDS["world"],
        method=UKA_WILDCARDS["method"],
    conda:
        env_file("base")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", UKA, stage="evaluate"),
    params:
        settings=UKA_SIM,
        seeds=UKA["seeds"],
        code=code_param("base", "workflows/uka/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule uka_report:
    input:
        unpack(uka_report_inputs),
        world=uka_path("raw", "needworld.json"),
        users=uka_path("raw", "users.parquet"),
    output:
        report=uka_path("report.md"),
        metrics=uka_path("metrics.json"),
        metrics_table=uka_path("metrics.parquet"),
        table_methods=report(uka_path("tables", "methods.csv"), category="uka", labels={"table": "methods"}),
        figure_success=report(uka_path("figures", "success.png"), category="uka", labels={"figure": "success rate"}),
        figure_entropy=report(uka_path("figures", "entropy.png"), category="uka", labels={"figure": "belief entropy"}),
        figure_strategies=report(
            uka_path("figures", "strategies.png"), category="uka", labels={"figure": "strategy mix"}
        ),
    log:
        uka_path("logs", "report.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=UKA["seeds"],
        control=UKA["control"],
        simulation=UKA["simulation"],
        training=UKA["training"],
        agent=UKA["agent"],
        embedding=UKA["embedding"],
        scale=RUN.scale,
        claims=UKA["claims"],
        claims_not_measured=UKA["claims_not_measured"],
        code=code_param("base", "workflows/uka/scripts/report.py"),
    script:
        "scripts/report.py"
