# enterpriseops_gym at smoke and tiny scale (source.kind synthetic): the generated sandbox, its template tasks, the
# offline agents and the scripted model over HTTP with the tools over MCP.

ENTERPRISEOPS_GYM_RUN_SETTINGS = {k: ENTERPRISEOPS_GYM[k] for k in ("random", "harness", "mock_llm")}


paper_stages(
    "enterpriseops_gym",
    ENTERPRISEOPS_GYM,
    enterpriseops_gym_path,
    stage(
        "download",
        script="download.py",
        env="base",
        resources=resources_of("cpu_light"),
        output=enterpriseops_gym_path("raw", "seed.sql"),
        reads=["source", "world"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="base",
        resources=resources_of("cpu_light"),
        input=enterpriseops_gym_path("raw", "seed.sql"),
        output=enterpriseops_gym_task_files(),
        reads=["tasks", "modes"],
    ),
    stage(
        "validate",
        script="validate.py",
        env="base",
        resources=resources_of("cpu_light"),
        input={
            "sql": enterpriseops_gym_path("raw", "seed.sql"),
            "tasks": enterpriseops_gym_path("tasks", "oracle.jsonl"),
        },
        output={
            "validation": enterpriseops_gym_path("validation", "validation.json"),
            "acceptance": enterpriseops_gym_path("validation", "acceptance.csv"),
            "mutation": enterpriseops_gym_path("validation", "mutation.csv"),
            "alternatives": enterpriseops_gym_path("validation", "alternatives.csv"),
        },
        reads=["mutation"],
    ),
    stage(
        "run_agents",  # the agents run their episodes: nothing is trained
        script="run_agents.py",
        env="agents",
        resources=heavy_resources("infer_gpu", ENTERPRISEOPS_GYM, stage="train"),
        unpack=lambda wc: keyed("tasks", enterpriseops_gym_task_files()),
        input={"sql": enterpriseops_gym_path("raw", "seed.sql")},
        output={
            "runs": enterpriseops_gym_path("runs", "{agent}.jsonl"),
            "notes": enterpriseops_gym_path("runs", "{agent}_notes.json"),
        },
        wildcards={"agent": "|".join(ENTERPRISEOPS_GYM["agents"])},
        tag="{agent}",
        benchmark=True,
        priority=10,  # the mock model over MCP is the longest job
        params={"settings": ENTERPRISEOPS_GYM_RUN_SETTINGS},
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="base",
        resources=resources_of("cpu_light"),
        unpack=enterpriseops_gym_runs,
        output=enterpriseops_gym_path("eval", "episodes.parquet"),
        benchmark=True,
    ),
    stage(
        "report",
        script="report.py",
        env="base",
        resources=resources_of("cpu_light"),
        unpack=enterpriseops_gym_runs,
        input={
            "episodes": enterpriseops_gym_path("eval", "episodes.parquet"),
            "validation": enterpriseops_gym_path("validation", "validation.json"),
            "acceptance": enterpriseops_gym_path("validation", "acceptance.csv"),
            "mutation": enterpriseops_gym_path("validation", "mutation.csv"),
            "alternatives": enterpriseops_gym_path("validation", "alternatives.csv"),
        },
        output={
            "report": enterpriseops_gym_path("report.md"),
            "metrics": enterpriseops_gym_path("metrics.json"),
            "metrics_table": enterpriseops_gym_path("metrics.parquet"),
            "table_agents": report(
                enterpriseops_gym_path("tables", "agents.csv"), category="enterpriseops_gym", labels={"table": "agents"}
            ),
            "table_domains": report(
                enterpriseops_gym_path("tables", "domains.csv"),
                category="enterpriseops_gym",
                labels={"table": "domains"},
            ),
            "table_pass_k": report(
                enterpriseops_gym_path("tables", "pass_k.csv"), category="enterpriseops_gym", labels={"table": "pass^k"}
            ),
            "table_mutation": report(
                enterpriseops_gym_path("tables", "mutation.csv"),
                category="enterpriseops_gym",
                labels={"table": "mutants"},
            ),
            "table_alternatives": report(
                enterpriseops_gym_path("tables", "alternatives.csv"),
                category="enterpriseops_gym",
                labels={"table": "alternatives"},
            ),
            "figure_success": report(
                enterpriseops_gym_path("figures", "success.png"),
                category="enterpriseops_gym",
                labels={"figure": "success"},
            ),
            "figure_domains": report(
                enterpriseops_gym_path("figures", "domains.png"),
                category="enterpriseops_gym",
                labels={"figure": "domains"},
            ),
        },
        reads=["world", "modes", "agents", "random", "claims", "claims_not_measured"],
        params={"llm": ENTERPRISEOPS_GYM["llm_cpu"], "scale": RUN.scale},
    ),
)
