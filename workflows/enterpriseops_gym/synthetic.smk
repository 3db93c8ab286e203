# enterpriseops_gym at smoke and tiny scale (source.kind synthetic): the generated sandbox, its template tasks, the
# offline agents and the scripted model over HTTP with the tools over MCP.

ENTERPRISEOPS_GYM_RUN_SETTINGS = {k: ENTERPRISEOPS_GYM[k] for k in ("random", "harness", "mock_llm")}


rule enterpriseops_gym_download:
    output:
        enterpriseops_gym_path("raw", "seed.sql"),
    log:
        enterpriseops_gym_path("logs", "download.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=ENTERPRISEOPS_GYM["source"],
        world=ENTERPRISEOPS_GYM["world"],
        code=code_param("base", "workflows/enterpriseops_gym/scripts/download.py"),
    script:
        "scripts/download.py"


rule enterpriseops_gym_preprocess:
    input:
        enterpriseops_gym_path("raw", "seed.sql"),
    output:
        **enterpriseops_gym_task_files(),
    log:
        enterpriseops_gym_path("logs", "preprocess.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        tasks=ENTERPRISEOPS_GYM["tasks"],
        modes=ENTERPRISEOPS_GYM["modes"],
        code=code_param("base", "workflows/enterpriseops_gym/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule enterpriseops_gym_validate:
    input:
        sql=enterpriseops_gym_path("raw", "seed.sql"),
        tasks=enterpriseops_gym_path("tasks", "oracle.jsonl"),
    output:
        validation=enterpriseops_gym_path("validation", "validation.json"),
        acceptance=enterpriseops_gym_path("validation", "acceptance.csv"),
        mutation=enterpriseops_gym_path("validation", "mutation.csv"),
        alternatives=enterpriseops_gym_path("validation", "alternatives.csv"),
    log:
        enterpriseops_gym_path("logs", "validate.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        mutation=ENTERPRISEOPS_GYM["mutation"],
        code=code_param("base", "workflows/enterpriseops_gym/scripts/validate.py"),
    script:
        "scripts/validate.py"


rule enterpriseops_gym_train:
    input:
        unpack(lambda wc: keyed("tasks", enterpriseops_gym_task_files())),
        sql=enterpriseops_gym_path("raw", "seed.sql"),
    output:
        runs=enterpriseops_gym_path("runs", "{agent}.jsonl"),
        notes=enterpriseops_gym_path("runs", "{agent}_notes.json"),
    log:
        enterpriseops_gym_path("logs", "train", "{agent}.log"),
    benchmark:
        enterpriseops_gym_path("benchmarks", "train_{agent}.tsv")
    wildcard_constraints:
        agent="|".join(ENTERPRISEOPS_GYM["agents"]),
    priority: 10  # the mock model over MCP is the longest job
    conda:
        env_file("agents")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", ENTERPRISEOPS_GYM, stage="train"),
    params:
        settings=ENTERPRISEOPS_GYM_RUN_SETTINGS,
        code=code_param("agents", "workflows/enterpriseops_gym/scripts/train.py"),
    script:
        "scripts/train.py"


rule enterpriseops_gym_evaluate:
    input:
        unpack(enterpriseops_gym_runs),
    output:
        enterpriseops_gym_path("eval", "episodes.parquet"),
    log:
        enterpriseops_gym_path("logs", "evaluate.log"),
    benchmark:
        enterpriseops_gym_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("base", "workflows/enterpriseops_gym/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule enterpriseops_gym_report:
    input:
        unpack(enterpriseops_gym_runs),
        episodes=enterpriseops_gym_path("eval", "episodes.parquet"),
        validation=enterpriseops_gym_path("validation", "validation.json"),
        acceptance=enterpriseops_gym_path("validation", "acceptance.csv"),
        mutation=enterpriseops_gym_path("validation", "mutation.csv"),
        alternatives=enterpriseops_gym_path("validation", "alternatives.csv"),
    output:
        report=enterpriseops_gym_path("report.md"),
        metrics=enterpriseops_gym_path("metrics.json"),
        metrics_table=enterpriseops_gym_path("metrics.parquet"),
        table_agents=report(
            enterpriseops_gym_path("tables", "agents.csv"), category="enterpriseops_gym", labels={"table": "agents"}
        ),
        table_domains=report(
            enterpriseops_gym_path("tables", "domains.csv"), category="enterpriseops_gym", labels={"table": "domains"}
        ),
        table_pass_k=report(
            enterpriseops_gym_path("tables", "pass_k.csv"), category="enterpriseops_gym", labels={"table": "pass^k"}
        ),
        table_mutation=report(
            enterpriseops_gym_path("tables", "mutation.csv"), category="enterpriseops_gym", labels={"table": "mutants"}
        ),
        table_alternatives=report(
            enterpriseops_gym_path("tables", "alternatives.csv"),
            category="enterpriseops_gym",
            labels={"table": "alternatives"},
        ),
        figure_success=report(
            enterpriseops_gym_path("figures", "success.png"),
            category="enterpriseops_gym",
            labels={"figure": "success"},
        ),
        figure_domains=report(
            enterpriseops_gym_path("figures", "domains.png"),
            category="enterpriseops_gym",
            labels={"figure": "domains"},
        ),
    log:
        enterpriseops_gym_path("logs", "report.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        world=ENTERPRISEOPS_GYM["world"],
        modes=ENTERPRISEOPS_GYM["modes"],
        agents=ENTERPRISEOPS_GYM["agents"],
        random=ENTERPRISEOPS_GYM["random"],
        llm=ENTERPRISEOPS_GYM["llm_cpu"],
        scale=RUN.scale,
        claims=ENTERPRISEOPS_GYM["claims"],
        claims_not_measured=ENTERPRISEOPS_GYM["claims_not_measured"],
        code=code_param("base", "workflows/enterpriseops_gym/scripts/report.py"),
    script:
        "scripts/report.py"
