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


def enterpriseops_gym_official_raw():
    return {m: enterpriseops_gym_path("raw", "official", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM_MODES}


def enterpriseops_gym_official_tasks():
    return {m: enterpriseops_gym_path("tasks", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM_MODES}


def enterpriseops_gym_model_input(wildcards):
    if wildcards.model in ENTERPRISEOPS_GYM_SERVED:
        return {"model": enterpriseops_gym_path("models", f"{wildcards.model}.json")}
    return {}


def enterpriseops_gym_domain_servers():
    from paperflow.enterpriseops_gym.containers import planned

    return planned(ENTERPRISEOPS_GYM_OFFICIAL.get("containers"), sorted(ENTERPRISEOPS_GYM_OFFICIAL["servers"]))


def enterpriseops_gym_model_runs():
    return keyed("runs", {m: enterpriseops_gym_path("runs", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM_MODELS})


rule enterpriseops_gym_download:
    output:
        **enterpriseops_gym_official_raw(),
        meta=enterpriseops_gym_path("raw", "official", "tasks.json"),
    log:
        enterpriseops_gym_path("logs", "download.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        dataset=ENTERPRISEOPS_GYM["source"]["tasks"],
        modes=ENTERPRISEOPS_GYM_MODES,
        domains=ENTERPRISEOPS_GYM_OFFICIAL["domains"],
        locked=ENTERPRISEOPS_GYM_LOCK.get(f"dataset:{ENTERPRISEOPS_GYM['source']['tasks']['hub']}"),
        cache=ENTERPRISEOPS_GYM_CACHE,
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/download_official.py"),
    script:
        "scripts/download_official.py"


rule enterpriseops_gym_download_dbs:
    output:
        enterpriseops_gym_path("raw", "official", "dbs.json"),
    log:
        enterpriseops_gym_path("logs", "download_dbs.log"),
    conda:
        env_file("lm")  # its modules reach the Hub helpers and the LM kit
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        dbs=ENTERPRISEOPS_GYM["source"]["dbs"],
        locked=ENTERPRISEOPS_GYM_FILE_LOCK.get(ENTERPRISEOPS_GYM["source"]["dbs"]["url"]),
        cache=ENTERPRISEOPS_GYM_CACHE,
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/download_dbs.py"),
    script:
        "scripts/download_dbs.py"


rule enterpriseops_gym_download_model:
    output:
        enterpriseops_gym_path("models", "{model}.json"),
    log:
        enterpriseops_gym_path("logs", "download_model_{model}.log"),
    wildcard_constraints:
        model="|".join(ENTERPRISEOPS_GYM_SERVED) or "^$",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        model=lambda wc: ENTERPRISEOPS_GYM_MODELS[wc.model],
        locked=lambda wc: ENTERPRISEOPS_GYM_LOCK.get(f"model:{ENTERPRISEOPS_GYM_MODELS[wc.model]['hub']}"),
        cache=ENTERPRISEOPS_GYM_CACHE,
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule enterpriseops_gym_preprocess:
    input:
        **keyed("raw", enterpriseops_gym_official_raw()),
        dbs=enterpriseops_gym_path("raw", "official", "dbs.json"),
    output:
        **enterpriseops_gym_official_tasks(),
    log:
        enterpriseops_gym_path("logs", "preprocess.log"),
    conda:
        env_file("lm")  # its modules reach the Hub helpers and the LM kit
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        servers=ENTERPRISEOPS_GYM_OFFICIAL["servers"],
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/preprocess_official.py"),
    script:
        "scripts/preprocess_official.py"


rule enterpriseops_gym_train:
    input:
        unpack(enterpriseops_gym_model_input),
        **keyed("tasks", enterpriseops_gym_official_tasks()),
    output:
        runs=enterpriseops_gym_path("runs", "{model}.jsonl"),
        notes=enterpriseops_gym_path("runs", "{model}_notes.json"),
    log:
        enterpriseops_gym_path("logs", "train", "{model}.log"),
    benchmark:
        enterpriseops_gym_path("benchmarks", "train_{model}.tsv")
    wildcard_constraints:
        model="|".join(ENTERPRISEOPS_GYM_MODELS),
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", ENTERPRISEOPS_GYM, stage="train", dataset="model"),
    params:
        model=lambda wc: ENTERPRISEOPS_GYM_MODELS[wc.model],
        official=ENTERPRISEOPS_GYM_OFFICIAL,
        server_log=lambda wc: enterpriseops_gym_path("logs", "train", f"{wc.model}_server.log"),
        # what the job runs per domain server (or why it refuses), from the same code: shown by the DAG tests
        domain_servers=enterpriseops_gym_domain_servers(),
        # the domain servers' logs, one per server (containers.domain_servers starts them under Apptainer)
        servers_log_dir=lambda wc: enterpriseops_gym_path("logs", "train", f"{wc.model}_servers"),
        code=code_param("lm-serve", "workflows/enterpriseops_gym/scripts/train_official.py"),
    script:
        "scripts/train_official.py"


rule enterpriseops_gym_evaluate:
    input:
        **enterpriseops_gym_model_runs(),
    output:
        enterpriseops_gym_path("eval", "episodes.parquet"),
    log:
        enterpriseops_gym_path("logs", "evaluate.log"),
    benchmark:
        enterpriseops_gym_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")  # its modules reach the Hub helpers and the LM kit
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/evaluate_official.py"),
    script:
        "scripts/evaluate_official.py"


rule enterpriseops_gym_report:
    input:
        episodes=enterpriseops_gym_path("eval", "episodes.parquet"),
        meta=enterpriseops_gym_path("raw", "official", "tasks.json"),
    output:
        report=enterpriseops_gym_path("report.md"),
        metrics=enterpriseops_gym_path("metrics.json"),
        table_success=report(
            enterpriseops_gym_path("tables", "success.csv"),
            category="enterpriseops_gym",
            labels={"table": "success per domain and mode"},
        ),
        table_verifier_pass=report(
            enterpriseops_gym_path("tables", "verifier_pass.csv"),
            category="enterpriseops_gym",
            labels={"table": "verifier pass rate"},
        ),
        table_pass_k=report(
            enterpriseops_gym_path("tables", "pass_k.csv"), category="enterpriseops_gym", labels={"table": "pass^k"}
        ),
        table_counts=report(
            enterpriseops_gym_path("tables", "counts.csv"), category="enterpriseops_gym", labels={"table": "episodes"}
        ),
    log:
        enterpriseops_gym_path("logs", "report.log"),
    conda:
        env_file("lm")  # its modules reach the Hub helpers and the LM kit
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        domains=ENTERPRISEOPS_GYM_OFFICIAL["domains"],
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/report_official.py"),
    script:
        "scripts/report_official.py"
