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


rule itpo_download_model:
    output:
        itpo_path("models", "pretrained.json"),
    log:
        itpo_path("logs", "download_model.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        ref=ITPO["pretrained"],
        key="pretrained",
        locked=itpo_locked(ITPO["pretrained"]),
        cache=ITPO_CACHE,
        code=code_param("lm", "workflows/itpo/scripts/download_hub.py"),
    script:
        "scripts/download_hub.py"


rule itpo_download_simulator:
    output:
        itpo_path("models", "simulator.json"),
    log:
        itpo_path("logs", "download_simulator.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=480),
    params:
        ref=ITPO["simulator"],
        key="simulator",
        locked=itpo_locked(ITPO["simulator"]),
        cache=ITPO_CACHE,
        code=code_param("lm", "workflows/itpo/scripts/download_hub.py"),
    script:
        "scripts/download_hub.py"


rule itpo_download:
    output:
        itpo_path("raw", "{task}.json"),
    log:
        itpo_path("logs", "download_{task}.log"),
    wildcard_constraints:
        task=ITPO_PAPER_WILDCARDS["task"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        ref=lambda wc: ITPO["tasks"][wc.task],
        key=lambda wc: f"tasks.{wc.task}",
        locked=lambda wc: itpo_locked(ITPO["tasks"][wc.task]),
        cache=ITPO_CACHE,
        code=code_param("lm", "workflows/itpo/scripts/download_hub.py"),
    script:
        "scripts/download_hub.py"


rule itpo_download_recipe:
    output:
        itpo_path("recipe", "recipe.json"),
    log:
        itpo_path("logs", "download_recipe.log"),
    conda:
        env_file("lm")  # its modules reach the Hub helpers and the LM kit
    threads: 1
    resources:
        **resources_of("cpu_light", runtime=60),
    params:
        recipe=ITPO["recipe"],
        cache=ITPO_CACHE,
        code=code_param("lm", "workflows/itpo/scripts/download_recipe.py"),
    script:
        "scripts/download_recipe.py"


rule itpo_preprocess:
    input:
        raw=itpo_path("raw", "{task}.json"),
        recipe=itpo_path("recipe", "recipe.json"),
    output:
        train=itpo_path("data", "{task}", "rl_train.parquet"),
        validation=itpo_path("data", "{task}", "rl_validation.parquet"),
    log:
        itpo_path("logs", "preprocess_{task}.log"),
    wildcard_constraints:
        task=ITPO_PAPER_WILDCARDS["task"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        task=lambda wc: ITPO["tasks"][wc.task],
        split=ITPO["split"],
        code=code_param("lm", "workflows/itpo/scripts/preprocess_collab.py"),
    script:
        "scripts/preprocess_collab.py"


rule itpo_train:
    input:
        pretrained=itpo_path("models", "pretrained.json"),
        simulator=itpo_path("models", "simulator.json"),
        recipe=itpo_path("recipe", "recipe.json"),
        train=itpo_path("data", "{task}", "rl_train.parquet"),
        validation=itpo_path("data", "{task}", "rl_validation.parquet"),
    output:
        run=itpo_path("runs", "{task}", "{method}", "{group}", "run.json"),
        turns=itpo_path("runs", "{task}", "{method}", "{group}", "turns.jsonl"),  # the recipe hook's per-turn log
    log:
        itpo_path("logs", "train", "{task}_{method}_{group}.log"),
    benchmark:
        itpo_path("benchmarks", "train_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **ITPO_PAPER_WILDCARDS,
    conda:
        env_file("lm-verl-itpo")  # the recipe's own stack: verl at its commit, vLLM 0.10.2, torch 2.8
    threads: 16
    resources:
        **heavy_resources("train_node_gpu", ITPO, stage="train"),
    params:
        seeds=lambda wc: ITPO_GROUPS[wc.group],
        cfg={k: ITPO[k] for k in ("tasks", "simulator", "verl")},
        code=code_param("lm-verl-itpo", "workflows/itpo/scripts/train_recipe.py"),
    script:
        "scripts/train_recipe.py"


rule itpo_evaluate:
    input:
        run=itpo_path("runs", "{task}", "{method}", "{group}", "run.json"),
        pretrained=itpo_path("models", "pretrained.json"),
        simulator=itpo_path("models", "simulator.json"),
        recipe=itpo_path("recipe", "recipe.json"),
        train=itpo_path("data", "{task}", "rl_train.parquet"),
        validation=itpo_path("data", "{task}", "rl_validation.parquet"),
    output:
        rollouts=itpo_path("eval", "{task}", "{method}_{group}.parquet"),
        summary=itpo_path("eval", "{task}", "{method}_{group}.json"),
    log:
        itpo_path("logs", "evaluate", "{task}_{method}_{group}.log"),
    benchmark:
        itpo_path("benchmarks", "evaluate_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **ITPO_PAPER_WILDCARDS,
    conda:
        env_file("lm-verl-itpo")  # the recipe's own stack: verl at its commit, vLLM 0.10.2, torch 2.8
    threads: 16
    resources:
        **heavy_resources("train_node_gpu", ITPO, stage="evaluate"),
    params:
        cfg={k: ITPO[k] for k in ("tasks", "simulator", "verl")},
        code=code_param("lm-verl-itpo", "workflows/itpo/scripts/evaluate_recipe.py"),
    script:
        "scripts/evaluate_recipe.py"


rule itpo_report:
    input:
        **itpo_runs_of("summary", "json"),
        **itpo_turn_logs(),
    output:
        report=itpo_path("report.md"),
        metrics=itpo_path("metrics.json"),
        metrics_table=itpo_path("metrics.parquet"),
        table_runs=report(itpo_path("tables", "runs.csv"), category="itpo", labels={"table": "per task and method"}),
    log:
        itpo_path("logs", "report.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=ITPO["methods"],
        tasks=ITPO_TASKS,
        seeds=ITPO["seeds"],
        metrics={t: ITPO["tasks"][t]["metric"] for t in ITPO_TASKS},
        scale=RUN.scale,
        claims=ITPO["claims"],
        claims_not_measured=ITPO["claims_not_measured"],
        code=code_param("base", "workflows/itpo/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
