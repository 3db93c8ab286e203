# confu at paper scale (source.kind specbench): each target of `targets` and each prompt set of `datasets` at its
# pinned Hub commit (config, else config/locks/confu.json, written by `paperflow pin confu`), Spec-Bench at its
# pinned sha256; per target the chat-template prompts, its greedy responses to the training prompts (one GPU per
# shard), the drafts on one node's GPUs (torchrun), target-only and speculative decoding at batch 1 on one GPU each.
from paperflow.core.download import read_lock_revisions

CONFU_TARGETS = list(CONFU["targets"])
CONFU_DATASETS = list(CONFU["datasets"])
CONFU_SHARDS = list(range(CONFU["prompts"]["shards"]))
CONFU_CACHE = f"{RUN.resources}/confu"
CONFU_LOCK = read_lock_revisions("confu", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
CONFU_WILDCARDS = {
    "target": "|".join(CONFU_TARGETS),
    "method": "|".join(CONFU_METHODS),
    "dataset": "|".join(CONFU_DATASETS),
    "shard": r"\d+",
}


def confu_locked(repo_type, hub):
    return CONFU_LOCK.get(f"{repo_type}:{hub}")


def confu_paper_train_inputs(wildcards):
    """The target, its regenerated shards; the continued methods also read its EAGLE-3 head."""
    t = wildcards.target
    inputs = {
        "pretrained": confu_path("models", t, "pretrained.json"),
        "data": [confu_path("data", t, f"draft_shard{s}.safetensors") for s in CONFU_SHARDS],
    }
    if wildcards.method not in CONFU_BASE_METHODS:
        inputs["init"] = confu_path("models", t, "eagle3.safetensors")
    return inputs


rule confu_download_model:
    output:
        confu_path("models", "{target}", "pretrained.json"),
    log:
        confu_path("logs", "download_model_{target}.log"),
    wildcard_constraints:
        target=CONFU_WILDCARDS["target"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        target=lambda wc: CONFU["targets"][wc.target],
        locked=lambda wc: confu_locked("model", CONFU["targets"][wc.target]["hub"]),
        cache=CONFU_CACHE,
        code=code_param("lm", "workflows/confu/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule confu_download:
    output:
        confu_path("raw", "{dataset}.parquet"),
    log:
        confu_path("logs", "download_{dataset}.log"),
    wildcard_constraints:
        dataset=CONFU_WILDCARDS["dataset"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        dataset=lambda wc: CONFU["datasets"][wc.dataset],
        locked=lambda wc: confu_locked("dataset", CONFU["datasets"][wc.dataset]["hub"]),
        cache=CONFU_CACHE,
        code=code_param("lm", "workflows/confu/scripts/download_dataset.py"),
    script:
        "scripts/download_dataset.py"


rule confu_download_benchmark:
    output:
        confu_path("raw", "specbench_questions.parquet"),
    log:
        confu_path("logs", "download_benchmark.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        benchmark=CONFU["benchmark"],
        cache=CONFU_CACHE,
        code=code_param("lm", "workflows/confu/scripts/download_benchmark.py"),
    script:
        "scripts/download_benchmark.py"


rule confu_preprocess:
    input:
        pretrained=confu_path("models", "{target}", "pretrained.json"),
        train=expand(confu_path("raw", "{dataset}.parquet"), dataset=CONFU_DATASETS),
        test=confu_path("raw", "specbench_questions.parquet"),
    output:
        train=confu_path("data", "{target}", "train_prompts.parquet"),
        test=confu_path("data", "{target}", "test_prompts.parquet"),
    log:
        confu_path("logs", "preprocess_{target}.log"),
    wildcard_constraints:
        target=CONFU_WILDCARDS["target"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **resources_of("cpu_medium"),
    params:
        prompts=CONFU["prompts"],
        code=code_param("lm", "workflows/confu/scripts/preprocess_paper.py"),
    script:
        "scripts/preprocess_paper.py"


rule confu_regenerate:
    input:
        pretrained=confu_path("models", "{target}", "pretrained.json"),
        train=confu_path("data", "{target}", "train_prompts.parquet"),
    output:
        confu_path("data", "{target}", "draft_shard{shard}.safetensors"),
    log:
        confu_path("logs", "regenerate", "{target}_shard{shard}.log"),
    benchmark:
        confu_path("benchmarks", "regenerate_{target}_shard{shard}.tsv")
    wildcard_constraints:
        target=CONFU_WILDCARDS["target"],
        shard=CONFU_WILDCARDS["shard"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", CONFU, stage="regenerate"),
    params:
        target=lambda wc: CONFU["targets"][wc.target],
        regenerate=CONFU["regenerate"],
        code=code_param("lm", "workflows/confu/scripts/regenerate.py"),
    script:
        "scripts/regenerate.py"


rule confu_train:
    input:
        unpack(confu_paper_train_inputs),
    output:
        head=confu_path("models", "{target}", "{method}.safetensors"),
        history=confu_path("models", "{target}", "{method}_history.csv"),
        spec=confu_path("models", "{target}", "{method}_spec.json"),
    log:
        confu_path("logs", "train", "{target}_{method}.log"),
    benchmark:
        confu_path("benchmarks", "train_{target}_{method}.tsv")
    wildcard_constraints:
        target=CONFU_WILDCARDS["target"],
        method=CONFU_WILDCARDS["method"],
    conda:
        env_file("lm")
    threads: 8
    resources:
        **heavy_resources("train_node_gpu", CONFU, stage="train"),
    params:
        target=lambda wc: CONFU["targets"][wc.target],
        seeds=CONFU_SEEDS,
        draft=CONFU["draft"],
        confu=CONFU["confu"],
        regenerate=CONFU["regenerate"],
        processes=CONFU["resources"]["gpus"],
        code=code_param("lm", "workflows/confu/scripts/train_paper.py"),
    script:
        "scripts/train_paper.py"


rule confu_evaluate_plain:
    input:
        pretrained=confu_path("models", "{target}", "pretrained.json"),
        test=confu_path("data", "{target}", "test_prompts.parquet"),
    output:
        confu_path("eval", "{target}", "plain.parquet"),
    log:
        confu_path("logs", "evaluate", "{target}_plain.log"),
    benchmark:
        confu_path("benchmarks", "evaluate_{target}_plain.tsv")
    wildcard_constraints:
        target=CONFU_WILDCARDS["target"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", CONFU, stage="evaluate"),
    params:
        target=lambda wc: CONFU["targets"][wc.target],
        decoding=CONFU["decoding"],
        code=code_param("lm", "workflows/confu/scripts/evaluate_plain.py"),
    script:
        "scripts/evaluate_plain.py"


rule confu_evaluate:
    input:
        pretrained=confu_path("models", "{target}", "pretrained.json"),
        head=confu_path("models", "{target}", "{method}.safetensors"),
        test=confu_path("data", "{target}", "test_prompts.parquet"),
        plain=confu_path("eval", "{target}", "plain.parquet"),
    output:
        confu_path("eval", "{target}", "{method}.parquet"),
    log:
        confu_path("logs", "evaluate", "{target}_{method}.log"),
    benchmark:
        confu_path("benchmarks", "evaluate_{target}_{method}.tsv")
    wildcard_constraints:
        target=CONFU_WILDCARDS["target"],
        method=CONFU_WILDCARDS["method"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", CONFU, stage="evaluate"),
    params:
        target=lambda wc: CONFU["targets"][wc.target],
        seeds=CONFU_SEEDS,
        decoding=CONFU["decoding"],
        code=code_param("lm", "workflows/confu/scripts/evaluate_paper.py"),
    script:
        "scripts/evaluate_paper.py"


rule confu_report:
    input:
        evals=expand(confu_path("eval", "{target}", "{method}.parquet"), target=CONFU_TARGETS, method=CONFU_METHODS),
        plain=expand(confu_path("eval", "{target}", "plain.parquet"), target=CONFU_TARGETS),
    output:
        report=confu_path("report.md"),
        metrics=confu_path("metrics.json"),
        metrics_table=confu_path("metrics.parquet"),
        table_tau=report(confu_path("tables", "tau.csv"), category="confu", labels={"table": "tau, speed-up, lossless"}),
        figure_tau=report(confu_path("figures", "tau.png"), category="confu", labels={"figure": "tau per method"}),
    log:
        confu_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        targets=CONFU["targets"],
        methods=CONFU_METHODS,
        seeds=CONFU_SEEDS,
        decoding=CONFU["decoding"],
        claims=CONFU["claims"],
        claims_not_measured=CONFU["claims_not_measured"],
        scale=RUN.scale,
        code=code_param("lm", "workflows/confu/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
