# lozo_plus at paper scale (source.kind superglue): the pretrained model (`pretrained`) downloaded once and each task
# of `tasks` at its pinned Hub commit (config, else config/locks/lozo_plus.json, written by `paperflow pin
# lozo_plus`), MeZO's samples and templates, and the ZO methods and the first-order reference per (task, method,
# seed), on the GPUs resources.train_gpus_by_model gives the (model, method): one, or several with the model sharded.
from paperflow.core.download import read_lock_revisions
from paperflow.lozo_plus.sharding import gpus_for

LOZO_PLUS_TASKS = list(LOZO_PLUS["tasks"])
LOZO_PLUS_CACHE = f"{RUN.resources}/lozo_plus"
LOZO_PLUS_LOCK = read_lock_revisions("lozo_plus", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns

LOZO_PLUS_HUB = LOZO_PLUS["pretrained"]["hub"]
# GPUs of a train job per (model, method) from resources.train_gpus_by_model: one-GPU methods run in
# lozo_plus_train (class train_gpu), the others in lozo_plus_train_node (class train_node_gpu, the model sharded)
LOZO_PLUS_GPUS = {m: gpus_for(LOZO_PLUS["resources"], LOZO_PLUS_HUB, m) for m in LOZO_PLUS["methods"]}
LOZO_PLUS_EVAL_GPUS = gpus_for(LOZO_PLUS["resources"], LOZO_PLUS_HUB, None, stage="evaluate")
LOZO_PLUS_NONE = "(?!x)x"  # a wildcard pattern that matches nothing


def lozo_plus_methods_on(node):
    """The methods whose train job takes one GPU (node False) or several (node True), as a wildcard pattern."""
    found = [m for m, n in LOZO_PLUS_GPUS.items() if (n > 1) == node]
    return "|".join(found) or LOZO_PLUS_NONE


LOZO_PLUS_WILDCARDS = {
    "task": "|".join(LOZO_PLUS_TASKS),
    "method": "|".join(LOZO_PLUS["methods"]),
    "group": r"s[0-9]+",
}


def lozo_plus_dataset(wildcards):
    return LOZO_PLUS["tasks"][wildcards.task]


def lozo_plus_locked(repo_type, hub):
    return LOZO_PLUS_LOCK.get(f"{repo_type}:{hub}")


def lozo_plus_paper_files(name, ext):
    """One file of every (task, method, group) run, keyed (task, method, group)."""
    runs = [(t, m, g) for t in LOZO_PLUS_TASKS for m, g in lozo_plus_runs()]
    return keyed(name, {(t, m, g): lozo_plus_path("runs", t, m, g, f"{name}.{ext}") for t, m, g in runs})


rule lozo_plus_download_model:
    output:
        lozo_plus_path("models", "pretrained.json"),
    log:
        lozo_plus_path("logs", "download_model.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        pretrained=LOZO_PLUS["pretrained"],
        locked=lozo_plus_locked("model", LOZO_PLUS["pretrained"]["hub"]),
        cache=LOZO_PLUS_CACHE,
        code=code_param("lm", "workflows/lozo_plus/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule lozo_plus_download:
    output:
        train=lozo_plus_path("raw", "{task}", "train.parquet"),
        validation=lozo_plus_path("raw", "{task}", "validation.parquet"),
    log:
        lozo_plus_path("logs", "download_{task}.log"),
    wildcard_constraints:
        task=LOZO_PLUS_WILDCARDS["task"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        dataset=lozo_plus_dataset,
        locked=lambda wc: lozo_plus_locked("dataset", LOZO_PLUS["tasks"][wc.task]["hub"]),
        cache=LOZO_PLUS_CACHE,
        code=code_param("lm", "workflows/lozo_plus/scripts/download_task.py"),
    script:
        "scripts/download_task.py"


rule lozo_plus_preprocess:
    input:
        train=lozo_plus_path("raw", "{task}", "train.parquet"),
        validation=lozo_plus_path("raw", "{task}", "validation.parquet"),
        pretrained=lozo_plus_path("models", "pretrained.json"),
    output:
        train=lozo_plus_path("data", "{task}", "train.parquet"),
        dev=lozo_plus_path("data", "{task}", "dev.parquet"),
        test=lozo_plus_path("data", "{task}", "test.parquet"),
    log:
        lozo_plus_path("logs", "preprocess_{task}.log"),
    wildcard_constraints:
        task=LOZO_PLUS_WILDCARDS["task"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        data=LOZO_PLUS["data"],
        dev=lambda wc: LOZO_PLUS["tasks"][wc.task]["dev"],
        max_length=LOZO_PLUS["pretrained"]["max_length"],
        code=code_param("lm", "workflows/lozo_plus/scripts/preprocess_task.py"),
    script:
        "scripts/preprocess_task.py"


# a train job on one GPU
rule lozo_plus_train:
    input:
        pretrained=lozo_plus_path("models", "pretrained.json"),
        train=lozo_plus_path("data", "{task}", "train.parquet"),
    output:
        models=temp(lozo_plus_path("runs", "{task}", "{method}", "{group}", "models.safetensors")),
        curve=lozo_plus_path("runs", "{task}", "{method}", "{group}", "curve.csv"),
        log=lozo_plus_path("runs", "{task}", "{method}", "{group}", "log.csv"),
        align=lozo_plus_path("runs", "{task}", "{method}", "{group}", "align.csv"),
        summary=lozo_plus_path("runs", "{task}", "{method}", "{group}", "summary.csv"),
    log:
        lozo_plus_path("logs", "train", "{task}_{method}_{group}.log"),
    benchmark:
        lozo_plus_path("benchmarks", "train_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **dict(LOZO_PLUS_WILDCARDS, method=lozo_plus_methods_on(False)),
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
    params:
        temporary=["models"],  # its temp() output: the record marks it, the audit accepts it deleted
        seeds=lozo_plus_seeds_of_group,
        pretrained=LOZO_PLUS["pretrained"],
        run=LOZO_PLUS["run"],
        zo=LOZO_PLUS["zo"],
        lr=LOZO_PLUS["lr"],
        ft=LOZO_PLUS["ft"],
        gpus=lambda wc: LOZO_PLUS_GPUS[wc.method],
        code=code_param("lm", "workflows/lozo_plus/scripts/train_pretrained.py"),
    script:
        "scripts/train_pretrained.py"


# a train job on several GPUs of one node: the model sharded over them (device_map auto), one process
rule lozo_plus_train_node:
    input:
        pretrained=lozo_plus_path("models", "pretrained.json"),
        train=lozo_plus_path("data", "{task}", "train.parquet"),
    output:
        models=temp(lozo_plus_path("runs", "{task}", "{method}", "{group}", "models.safetensors")),
        curve=lozo_plus_path("runs", "{task}", "{method}", "{group}", "curve.csv"),
        log=lozo_plus_path("runs", "{task}", "{method}", "{group}", "log.csv"),
        align=lozo_plus_path("runs", "{task}", "{method}", "{group}", "align.csv"),
        summary=lozo_plus_path("runs", "{task}", "{method}", "{group}", "summary.csv"),
    log:
        lozo_plus_path("logs", "train", "{task}_{method}_{group}.log"),
    benchmark:
        lozo_plus_path("benchmarks", "train_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **dict(LOZO_PLUS_WILDCARDS, method=lozo_plus_methods_on(True)),
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("train_node_gpu", LOZO_PLUS, gpus=lambda wc: LOZO_PLUS_GPUS[wc.method]),
    params:
        temporary=["models"],  # its temp() output: the record marks it, the audit accepts it deleted
        seeds=lozo_plus_seeds_of_group,
        pretrained=LOZO_PLUS["pretrained"],
        run=LOZO_PLUS["run"],
        zo=LOZO_PLUS["zo"],
        lr=LOZO_PLUS["lr"],
        ft=LOZO_PLUS["ft"],
        gpus=lambda wc: LOZO_PLUS_GPUS[wc.method],
        code=code_param("lm", "workflows/lozo_plus/scripts/train_pretrained.py"),
    script:
        "scripts/train_pretrained.py"


rule lozo_plus_evaluate:
    input:
        pretrained=lozo_plus_path("models", "pretrained.json"),
        models=lozo_plus_path("runs", "{task}", "{method}", "{group}", "models.safetensors"),
        dev=lozo_plus_path("data", "{task}", "dev.parquet"),
        test=lozo_plus_path("data", "{task}", "test.parquet"),
    output:
        lozo_plus_path("eval", "{task}", "{method}_{group}.parquet"),
    log:
        lozo_plus_path("logs", "evaluate", "{task}_{method}_{group}.log"),
    benchmark:
        lozo_plus_path("benchmarks", "evaluate_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **LOZO_PLUS_WILDCARDS,
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate", gpus=LOZO_PLUS_EVAL_GPUS),
    params:
        seeds=lozo_plus_seeds_of_group,
        pretrained=LOZO_PLUS["pretrained"],
        gpus=LOZO_PLUS_EVAL_GPUS,
        max_new_tokens=lambda wc: LOZO_PLUS["tasks"][wc.task].get("max_new_tokens", 50),
        code=code_param("lm", "workflows/lozo_plus/scripts/evaluate_pretrained.py"),
    script:
        "scripts/evaluate_pretrained.py"


rule lozo_plus_report:
    input:
        **keyed(
            "eval",
            {
                (t, m, g): lozo_plus_path("eval", t, f"{m}_{g}.parquet")
                for t in LOZO_PLUS_TASKS
                for m, g in lozo_plus_runs()
            },
        ),
        **lozo_plus_paper_files("curve", "csv"),
        **lozo_plus_paper_files("summary", "csv"),
    output:
        report=lozo_plus_path("report.md"),
        metrics=lozo_plus_path("metrics.json"),
        metrics_table=lozo_plus_path("metrics.parquet"),
        table_tasks=report(
            lozo_plus_path("tables", "tasks.csv"), category="lozo_plus", labels={"table": "accuracy per task"}
        ),
        figure_loss=report(
            lozo_plus_path("figures", "loss_vs_forwards.png"),
            category="lozo_plus",
            labels={"figure": "train loss vs forward passes"},
        ),
    log:
        lozo_plus_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=LOZO_PLUS["methods"],
        tasks=LOZO_PLUS_TASKS,
        seeds=LOZO_PLUS["seeds"],
        pretrained=LOZO_PLUS["pretrained"],
        run=LOZO_PLUS["run"],
        lr=LOZO_PLUS["lr"],
        ft=LOZO_PLUS["ft"],
        scale=RUN.scale,
        claims=LOZO_PLUS["claims"],
        claims_not_measured=LOZO_PLUS["claims_not_measured"],
        code=code_param("lm", "workflows/lozo_plus/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
