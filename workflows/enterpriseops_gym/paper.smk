# enterpriseops_gym at paper scale (source.kind official): the official task set (Hugging Face dataset, every mode
# and domain of `official`), gym_dbs.zip and each open model at pinned commits (config, else
# config/locks/enterpriseops_gym.json, written by `paperflow pin enterpriseops_gym`); one ReAct run per model against
# the official domain servers (`official.servers`), open models served by vLLM on the train job's GPUs.
from paperflow.core.download import read_lock, read_lock_revisions

ENTERPRISEOPS_GYM_OFFICIAL = ENTERPRISEOPS_GYM["official"]
ENTERPRISEOPS_GYM_MODES = list(ENTERPRISEOPS_GYM_OFFICIAL["modes"])
ENTERPRISEOPS_GYM_MODELS = dict(ENTERPRISEOPS_GYM_OFFICIAL["models"])
ENTERPRISEOPS_GYM_SERVED = [m for m, c in ENTERPRISEOPS_GYM_MODELS.items() if c["serve"] == "vllm"]
ENTERPRISEOPS_GYM_CACHE = f"{RUN.resources}/enterpriseops_gym"
# a pin changes the params: the download reruns
ENTERPRISEOPS_GYM_LOCK = read_lock_revisions("enterpriseops_gym", PAPERFLOW_ROOT)
ENTERPRISEOPS_GYM_FILE_LOCK = read_lock("enterpriseops_gym", PAPERFLOW_ROOT)


paper_stages(
    "enterpriseops_gym",
    ENTERPRISEOPS_GYM,
    enterpriseops_gym_path,
    stage(
        "download",
        script="download_official.py",
        env="lm",
        resources=resources_of("cpu_light"),
        output={
            **enterpriseops_gym_official_raw(),
            "meta": enterpriseops_gym_path("raw", "official", "tasks.json"),
        },
        params={
            "dataset": ENTERPRISEOPS_GYM["source"]["tasks"],
            "modes": ENTERPRISEOPS_GYM_MODES,
            "domains": ENTERPRISEOPS_GYM_OFFICIAL["domains"],
            "locked": ENTERPRISEOPS_GYM_LOCK.get(f"dataset:{ENTERPRISEOPS_GYM['source']['tasks']['hub']}"),
            "cache": ENTERPRISEOPS_GYM_CACHE,
        },
    ),
    stage(
        "download_dbs",
        script="download_dbs.py",
        env="lm",  # its modules reach the Hub helpers and the LM kit
        resources=resources_of("cpu_light"),
        output=enterpriseops_gym_path("raw", "official", "dbs.json"),
        params={
            "dbs": ENTERPRISEOPS_GYM["source"]["dbs"],
            "locked": ENTERPRISEOPS_GYM_FILE_LOCK.get(ENTERPRISEOPS_GYM["source"]["dbs"]["url"]),
            "cache": ENTERPRISEOPS_GYM_CACHE,
        },
    ),
    hub_model_stage(
        "enterpriseops_gym",
        "download_model",
        lambda wc: ENTERPRISEOPS_GYM_MODELS[wc.model],
        lambda wc: f"official.models.{wc.model}.revision",
        ENTERPRISEOPS_GYM_CACHE,
        enterpriseops_gym_path("models", "{model}.json"),
        resources=resources_of("cpu_medium", runtime=240),
        wildcards={"model": "|".join(ENTERPRISEOPS_GYM_SERVED) or "^$"},
        log="download_model_{model}.log",
        params={"locked": lambda wc: ENTERPRISEOPS_GYM_LOCK.get(f"model:{ENTERPRISEOPS_GYM_MODELS[wc.model]['hub']}")},
    ),
    stage(
        "preprocess",
        script="preprocess_official.py",
        env="lm",  # its modules reach the Hub helpers and the LM kit
        resources=resources_of("cpu_light"),
        input={
            **keyed("raw", enterpriseops_gym_official_raw()),
            "dbs": enterpriseops_gym_path("raw", "official", "dbs.json"),
        },
        output=enterpriseops_gym_official_tasks(),
        params={"servers": ENTERPRISEOPS_GYM_OFFICIAL["servers"]},
    ),
    stage(
        "run_agents",  # the agents run their episodes: nothing is trained
        script="run_agents_official.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", ENTERPRISEOPS_GYM, stage="train", dataset="model"),
        unpack=enterpriseops_gym_model_input,
        input=keyed("tasks", enterpriseops_gym_official_tasks()),
        output={
            "runs": enterpriseops_gym_path("runs", "{model}.jsonl"),
            "notes": enterpriseops_gym_path("runs", "{model}_notes.json"),
        },
        wildcards={"model": "|".join(ENTERPRISEOPS_GYM_MODELS)},
        tag="{model}",
        benchmark=True,
        threads=4,
        params={
            "model": lambda wc: ENTERPRISEOPS_GYM_MODELS[wc.model],
            "official": ENTERPRISEOPS_GYM_OFFICIAL,
            "server_log": lambda wc: enterpriseops_gym_path("logs", "run_agents", f"{wc.model}_server.log"),
            # what the job runs per domain server (or why it refuses), from the same code: shown by the DAG tests
            "domain_servers": enterpriseops_gym_domain_servers(),
            # the domain servers' logs, one per server (containers.domain_servers starts them under Apptainer)
            "servers_log_dir": lambda wc: enterpriseops_gym_path("logs", "run_agents", f"{wc.model}_servers"),
        },
    ),
    stage(
        "evaluate",
        script="evaluate_official.py",
        env="lm",  # its modules reach the Hub helpers and the LM kit
        resources=resources_of("cpu_light"),
        input=enterpriseops_gym_model_runs(),
        output=enterpriseops_gym_path("eval", "episodes.parquet"),
        benchmark=True,
    ),
    stage(
        "report",
        script="report_official.py",
        env="lm",  # its modules reach the Hub helpers and the LM kit
        resources=resources_of("cpu_light"),
        input={
            "episodes": enterpriseops_gym_path("eval", "episodes.parquet"),
            "meta": enterpriseops_gym_path("raw", "official", "tasks.json"),
        },
        output={
            "report": enterpriseops_gym_path("report.md"),
            "metrics": enterpriseops_gym_path("metrics.json"),
            "table_success": report(
                enterpriseops_gym_path("tables", "success.csv"),
                category="enterpriseops_gym",
                labels={"table": "success per domain and mode"},
            ),
            "table_verifier_pass": report(
                enterpriseops_gym_path("tables", "verifier_pass.csv"),
                category="enterpriseops_gym",
                labels={"table": "verifier pass rate"},
            ),
            "table_pass_k": report(
                enterpriseops_gym_path("tables", "pass_k.csv"), category="enterpriseops_gym", labels={"table": "pass^k"}
            ),
            "table_counts": report(
                enterpriseops_gym_path("tables", "counts.csv"),
                category="enterpriseops_gym",
                labels={"table": "episodes"},
            ),
        },
        params={"domains": ENTERPRISEOPS_GYM_OFFICIAL["domains"]},
    ),
)
