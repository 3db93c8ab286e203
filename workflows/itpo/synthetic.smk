# itpo at smoke and tiny scale (source.kind synthetic): the ask-then-answer tutoring environment, SFT of the
# initial policy, RL per method and seed group, evaluation, the turn analysis and the report.


paper_stages(
    "itpo",
    ITPO,
    itpo_path,
    stage(
        "download",
        script="download.py",
        env="lm",  # the environment module reaches the kit's tokenizer and sampler (torch, transformers)
        resources=resources_of("cpu_light"),
        output={
            "eval_tasks": itpo_path("raw", "eval_tasks.parquet"),
            "analysis_tasks": itpo_path("raw", "analysis_tasks.parquet"),
        },
        reads=["source", "task"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=itpo_path("raw", "eval_tasks.parquet"),
        output={"vocabulary": itpo_path("data", "vocabulary.json")},
    ),
    stage(
        "sft_init",
        script="sft_init.py",
        env="lm",
        resources=heavy_resources("train_gpu", ITPO, stage="train"),
        input={
            "vocabulary": itpo_path("data", "vocabulary.json"),
            "eval_tasks": itpo_path("raw", "eval_tasks.parquet"),
        },
        output={
            "checkpoint": itpo_path("models", "init.safetensors"),
            "history": itpo_path("models", "init_history.csv"),
        },
        benchmark=True,
        reads=["model", "sft"],
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", ITPO, stage="train"),
        input={
            "init": itpo_path("models", "init.safetensors"),
            "eval_tasks": itpo_path("raw", "eval_tasks.parquet"),
        },
        output={
            "checkpoints": itpo_path("models", "{method}", "{group}.safetensors"),
            "curves": itpo_path("models", "{method}", "{group}_curves.csv"),
        },
        wildcards={"method": ITPO_WILDCARDS["method"], "group": ITPO_WILDCARDS["group"]},
        tag="{method}_{group}",
        benchmark=True,
        reads=["rl"],
        params={"seeds": lambda wc: ITPO_GROUPS[wc.group]},
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", ITPO, stage="evaluate"),
        unpack=itpo_policies,
        input={"eval_tasks": itpo_path("raw", "eval_tasks.parquet")},
        output=itpo_path("eval", "final.parquet"),
        benchmark=True,
    ),
    stage(
        "turn_analysis",
        script="turn_analysis.py",
        env="lm",
        resources=heavy_resources("infer_gpu", ITPO, stage="evaluate"),
        unpack=itpo_analysis_inputs,
        input={
            "init": itpo_path("models", "init.safetensors"),
            "analysis_tasks": itpo_path("raw", "analysis_tasks.parquet"),
        },
        output=itpo_path("analysis", "turns.parquet"),
        benchmark=True,
        reads=["analysis"],
        params={"beta": ITPO["rl"]["beta"]},
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=itpo_curves,
        input={
            "final": itpo_path("eval", "final.parquet"),
            "turns": itpo_path("analysis", "turns.parquet"),
            "init_history": itpo_path("models", "init_history.csv"),
        },
        output={
            "report": itpo_path("report.md"),
            "metrics": itpo_path("metrics.json"),
            "metrics_table": itpo_path("metrics.parquet"),
            "table_runs": report(
                itpo_path("tables", "runs.csv"), category="itpo", labels={"table": "per method and seed"}
            ),
            "table_turns": report(
                itpo_path("tables", "turns.csv"), category="itpo", labels={"table": "turns by action"}
            ),
            "figure_success": report(
                itpo_path("figures", "success.png"), category="itpo", labels={"figure": "success"}
            ),
            "figure_turn_scores": report(
                itpo_path("figures", "turn_scores.png"), category="itpo", labels={"figure": "turn scores"}
            ),
            "figure_volatility": report(
                itpo_path("figures", "volatility.png"), category="itpo", labels={"figure": "advantage volatility"}
            ),
        },
        reads=["methods", "seeds", "sft", "analysis_ci", "claims", "claims_not_measured"],
        params={"scale": RUN.scale, "control_methods": ITPO["rl"]["control_methods"]},
    ),
)
