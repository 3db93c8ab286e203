# itpo at paper scale (source.kind collabllm): the policy model (also the implicit PRM and the reference) and the
# simulator/judge model at pinned Hub commits, each task of `tasks` at its pinned Hub commit (config, else
# config/locks/itpo.json, written by `paperflow pin itpo`), the official recipe (ITPO + verl at pinned git commits),
# verl's RL rows per task, and the recipe's training and evaluation per (task, method, seed): verl on
# verl.n_gpus GPUs and the vLLM simulator/judge on simulator.tensor_parallel more, in one job on one node.
from paperflow.core.download import read_lock_revisions

ITPO_TASKS = list(ITPO["tasks"])
ITPO_CACHE = f"{RUN.resources}/itpo"
ITPO_LOCK = read_lock_revisions("itpo", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
ITPO_PAPER_WILDCARDS = {"task": "|".join(ITPO_TASKS), **ITPO_WILDCARDS}


paper_stages(
    "itpo",
    ITPO,
    itpo_path,
    stage(
        "download_model",
        script="download_hub.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=240),
        output=itpo_path("models", "pretrained.json"),
        params={
            "ref": ITPO["pretrained"],
            "key": "pretrained",
            "locked": itpo_locked(ITPO["pretrained"]),
            "cache": ITPO_CACHE,
        },
    ),
    stage(
        "download_simulator",
        script="download_hub.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=480),
        output=itpo_path("models", "simulator.json"),
        params={
            "ref": ITPO["simulator"],
            "key": "simulator",
            "locked": itpo_locked(ITPO["simulator"]),
            "cache": ITPO_CACHE,
        },
    ),
    stage(
        "download",
        script="download_hub.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output=itpo_path("raw", "{task}.json"),
        wildcards={"task": ITPO_PAPER_WILDCARDS["task"]},
        log="download_{task}.log",
        params={
            "ref": lambda wc: ITPO["tasks"][wc.task],
            "key": lambda wc: f"tasks.{wc.task}",
            "locked": lambda wc: itpo_locked(ITPO["tasks"][wc.task]),
            "cache": ITPO_CACHE,
        },
    ),
    stage(
        "download_recipe",
        script="download_recipe.py",
        env="lm",  # its modules reach the Hub helpers and the LM kit
        resources=resources_of("cpu_light", runtime=60),
        output=itpo_path("recipe", "recipe.json"),
        reads=["recipe"],
        params={"cache": ITPO_CACHE},
    ),
    stage(
        "preprocess",
        script="preprocess_collab.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={"raw": itpo_path("raw", "{task}.json"), "recipe": itpo_path("recipe", "recipe.json")},
        output={
            "train": itpo_path("data", "{task}", "rl_train.parquet"),
            "validation": itpo_path("data", "{task}", "rl_validation.parquet"),
        },
        wildcards={"task": ITPO_PAPER_WILDCARDS["task"]},
        log="preprocess_{task}.log",
        reads=["split"],
        params={"task": lambda wc: ITPO["tasks"][wc.task]},
    ),
    stage(
        "train",
        script="train_recipe.py",
        env="lm-verl-itpo",  # the recipe's own stack: verl at its commit, vLLM 0.10.2, torch 2.8
        resources=heavy_resources("train_node_gpu", ITPO, stage="train"),
        input={
            "pretrained": itpo_path("models", "pretrained.json"),
            "simulator": itpo_path("models", "simulator.json"),
            "recipe": itpo_path("recipe", "recipe.json"),
            "train": itpo_path("data", "{task}", "rl_train.parquet"),
            "validation": itpo_path("data", "{task}", "rl_validation.parquet"),
        },
        output={
            "run": itpo_path("runs", "{task}", "{method}", "{group}", "run.json"),
            # the recipe hook's per-turn log
            "turns": itpo_path("runs", "{task}", "{method}", "{group}", "turns.jsonl"),
        },
        wildcards=ITPO_PAPER_WILDCARDS,
        tag="{task}_{method}_{group}",
        benchmark=True,
        threads=16,
        params={
            "seeds": lambda wc: ITPO_GROUPS[wc.group],
            "cfg": {k: ITPO[k] for k in ("tasks", "simulator", "verl")},
        },
    ),
    stage(
        "evaluate",
        script="evaluate_recipe.py",
        env="lm-verl-itpo",  # the recipe's own stack: verl at its commit, vLLM 0.10.2, torch 2.8
        resources=heavy_resources("train_node_gpu", ITPO, stage="evaluate"),
        input={
            "run": itpo_path("runs", "{task}", "{method}", "{group}", "run.json"),
            "pretrained": itpo_path("models", "pretrained.json"),
            "simulator": itpo_path("models", "simulator.json"),
            "recipe": itpo_path("recipe", "recipe.json"),
            "train": itpo_path("data", "{task}", "rl_train.parquet"),
            "validation": itpo_path("data", "{task}", "rl_validation.parquet"),
        },
        output={
            "rollouts": itpo_path("eval", "{task}", "{method}_{group}.parquet"),
            "summary": itpo_path("eval", "{task}", "{method}_{group}.json"),
        },
        wildcards=ITPO_PAPER_WILDCARDS,
        tag="{task}_{method}_{group}",
        benchmark=True,
        threads=16,
        params={"cfg": {k: ITPO[k] for k in ("tasks", "simulator", "verl", "evaluate")}},
    ),
    stage(
        "report",
        script="report_paper.py",
        env="base",
        resources=resources_of("cpu_light"),
        input={**itpo_runs_of("summary", "json"), **itpo_turn_logs()},
        output={
            "report": itpo_path("report.md"),
            "metrics": itpo_path("metrics.json"),
            "metrics_table": itpo_path("metrics.parquet"),
            "table_runs": report(
                itpo_path("tables", "runs.csv"), category="itpo", labels={"table": "per task and method"}
            ),
        },
        reads=["methods", "seeds", "claims", "claims_not_measured"],
        params={
            "tasks": ITPO_TASKS,
            "metrics": {t: ITPO["tasks"][t]["metric"] for t in ITPO_TASKS},
            "scale": RUN.scale,
        },
    ),
)
