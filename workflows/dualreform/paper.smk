# dualreform at paper scale (source.kind topiocqa): the pretrained instruct model and TopiOCQA (conversations, corpus)
# at their pinned Hub commits (config, else config/locks/dualreform.json, written by `paperflow pin dualreform`), the
# bm25s index of the corpus and the turns table (CPU, many threads), the corpus encoded by the dense retriever (one
# GPU; when `dense` is set), each trained method per seed on one GPU (the model samples its candidates, ranked with
# the saved index, then TRL's SFTTrainer and DPOTrainer with LoRA), test-turn retrieval of greedy rewrites (BM25,
# dense) per method and seed on one GPU, the report.
from paperflow.core.download import read_lock_revisions

DUALREFORM_CACHE = f"{RUN.resources}/dualreform"
DUALREFORM_LOCK = read_lock_revisions("dualreform", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
DUALREFORM_TRAINED = [m for m in ("retpo", "dualreform", "single_role", "random_ref") if m in DUALREFORM["methods"]]
DUALREFORM_WILDCARDS = {
    "trained": "|".join(DUALREFORM_TRAINED) or "^$",
    "method": "|".join(DUALREFORM["methods"]),
    "seed": "|".join(map(str, DUALREFORM["seeds"])),
}
DUALREFORM_RES = DUALREFORM["resources"]
DUALREFORM_DENSE = DUALREFORM.get("dense")  # None: BM25 only
DUALREFORM_TABLE = dualreform_path("data", "turns.parquet")
DUALREFORM_INDEX = dualreform_path("data", "bm25_index", "paperflow-index.json")  # written last into the index folder


rule dualreform_download_model:
    output:
        dualreform_path("models", "pretrained.json"),
    log:
        dualreform_path("logs", "download_model.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=120),
    params:
        key="pretrained",
        pretrained=DUALREFORM["pretrained"],
        locked=dualreform_locked(DUALREFORM["pretrained"]),
        cache=DUALREFORM_CACHE,
        code=code_param("lm", "workflows/dualreform/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule dualreform_download:
    output:
        passages=dualreform_path("raw", "passages.parquet"),
        turns=dualreform_path("raw", "turns.parquet"),
    log:
        dualreform_path("logs", "download.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240, mem_mb=DUALREFORM_RES.get("preprocess_mem_mb", 8000)),
    params:
        data=DUALREFORM["data"],
        locked=[dualreform_locked(DUALREFORM["data"][k]) for k in ("conversations", "corpus")],
        cache=DUALREFORM_CACHE,
        code=code_param("lm", "workflows/dualreform/scripts/download_data.py"),
    script:
        "scripts/download_data.py"


if DUALREFORM_DENSE:

    rule dualreform_download_dense:
        output:
            dualreform_path("models", "dense.json"),
        log:
            dualreform_path("logs", "download_dense.log"),
        conda:
            env_file("lm")
        threads: 1
        resources:
            **resources_of("cpu_medium", runtime=120),
        params:
            key="dense",
            pretrained=DUALREFORM_DENSE,
            locked=dualreform_locked(DUALREFORM_DENSE),
            cache=DUALREFORM_CACHE,
            code=code_param("lm", "workflows/dualreform/scripts/download_model.py"),
        script:
            "scripts/download_model.py"

    rule dualreform_index_dense:
        input:
            passages=dualreform_path("raw", "passages.parquet"),
            dense=dualreform_path("models", "dense.json"),
        output:
            dualreform_path("data", "dense.npy"),
        log:
            dualreform_path("logs", "index_dense.log"),
        benchmark:
            dualreform_path("benchmarks", "index_dense.tsv")
        conda:
            env_file("lm")
        threads: 4
        resources:
            **heavy_resources("infer_gpu", DUALREFORM, stage="index"),
        params:
            dense=DUALREFORM_DENSE,
            code=code_param("lm", "workflows/dualreform/scripts/index_dense.py"),
        script:
            "scripts/index_dense.py"


rule dualreform_preprocess:
    input:
        passages=dualreform_path("raw", "passages.parquet"),
        turns=dualreform_path("raw", "turns.parquet"),
    output:
        table=DUALREFORM_TABLE,
        index=DUALREFORM_INDEX,
    log:
        dualreform_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: DUALREFORM_RES.get("preprocess_threads", 1)
    resources:
        **resources_of(
            "cpu_medium",
            runtime=DUALREFORM_RES.get("preprocess_runtime_min", 60),
            mem_mb=DUALREFORM_RES.get("preprocess_mem_mb", 8000),
        ),
    params:
        bm25=DUALREFORM["bm25"],
        code=code_param("lm", "workflows/dualreform/scripts/preprocess_paper.py"),
    script:
        "scripts/preprocess_paper.py"


rule dualreform_train:
    input:
        pretrained=dualreform_path("models", "pretrained.json"),
        table=DUALREFORM_TABLE,
        index=DUALREFORM_INDEX,
    output:
        checkpoints=[dualreform_path("models", "{method}", "seed{seed}_it1.safetensors")],
        history=dualreform_path("models", "{method}", "history_seed{seed}.csv"),
        refs=dualreform_path("models", "{method}", "refs_seed{seed}.parquet"),
    log:
        dualreform_path("logs", "train", "{method}_seed{seed}.log"),
    benchmark:
        dualreform_path("benchmarks", "train_{method}_seed{seed}.tsv")
    wildcard_constraints:
        method="|".join(m for m in DUALREFORM_TRAINED if m != "dualreform") or "^$",
        seed=DUALREFORM_WILDCARDS["seed"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("train_gpu", DUALREFORM, stage="train"),
    params:
        pretrained=DUALREFORM["pretrained"],
        lora=DUALREFORM["lora"],
        trl_sft=DUALREFORM["trl_sft"],
        trl_dpo=DUALREFORM["trl_dpo"],
        iterations=DUALREFORM["iterations"],
        generation=DUALREFORM["generation"],
        code=code_param("lm", "workflows/dualreform/scripts/train_paper.py"),
    script:
        "scripts/train_paper.py"


rule dualreform_train_iterated:
    input:
        pretrained=dualreform_path("models", "pretrained.json"),
        table=DUALREFORM_TABLE,
        index=DUALREFORM_INDEX,
    output:
        checkpoints=dualreform_rounds("dualreform", "{seed}"),
        history=dualreform_path("models", "dualreform", "history_seed{seed}.csv"),
        refs=dualreform_path("models", "dualreform", "refs_seed{seed}.parquet"),
    log:
        dualreform_path("logs", "train", "dualreform_seed{seed}.log"),
    benchmark:
        dualreform_path("benchmarks", "train_dualreform_seed{seed}.tsv")
    wildcard_constraints:
        seed=DUALREFORM_WILDCARDS["seed"],
    priority: 10  # the longest job
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("train_gpu", DUALREFORM, stage="train"),
    params:
        method="dualreform",
        pretrained=DUALREFORM["pretrained"],
        lora=DUALREFORM["lora"],
        trl_sft=DUALREFORM["trl_sft"],
        trl_dpo=DUALREFORM["trl_dpo"],
        iterations=DUALREFORM["iterations"],
        generation=DUALREFORM["generation"],
        code=code_param("lm", "workflows/dualreform/scripts/train_paper.py"),
    script:
        "scripts/train_paper.py"


rule dualreform_evaluate:
    input:
        unpack(dualreform_eval_inputs),
        table=DUALREFORM_TABLE,
        index=DUALREFORM_INDEX,
    output:
        dualreform_path("eval", "{method}_seed{seed}.parquet"),
    log:
        dualreform_path("logs", "evaluate", "{method}_seed{seed}.log"),
    benchmark:
        dualreform_path("benchmarks", "evaluate_{method}_seed{seed}.tsv")
    wildcard_constraints:
        method=DUALREFORM_WILDCARDS["method"],
        seed=DUALREFORM_WILDCARDS["seed"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", DUALREFORM, stage="evaluate"),
    params:
        pretrained=DUALREFORM["pretrained"],
        dense=DUALREFORM_DENSE,
        generation=DUALREFORM["generation"],
        code=code_param("lm", "workflows/dualreform/scripts/evaluate_paper.py"),
    script:
        "scripts/evaluate_paper.py"


rule dualreform_report:
    input:
        **keyed(
            "eval",
            {
                (m, s): dualreform_path("eval", f"{m}_seed{s}.parquet")
                for m in DUALREFORM["methods"]
                for s in DUALREFORM["seeds"]
            },
        ),
        **keyed(
            "refs",
            {
                (m, s): dualreform_path("models", m, f"refs_seed{s}.parquet")
                for m in DUALREFORM_TRAINED
                for s in DUALREFORM["seeds"]
            },
        ),
        table=DUALREFORM_TABLE,
    output:
        report=dualreform_path("report.md"),
        metrics=dualreform_path("metrics.json"),
        metrics_table=dualreform_path("metrics.parquet"),
        table_retrieval=report(
            dualreform_path("tables", "retrieval.csv"), category="dualreform", labels={"table": "retrieval"}
        ),
        figure_mrr=report(dualreform_path("figures", "mrr.png"), category="dualreform", labels={"figure": "MRR"}),
    log:
        dualreform_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        seeds=DUALREFORM["seeds"],
        methods=DUALREFORM["methods"],
        iterations=DUALREFORM["iterations"],
        pretrained=DUALREFORM["pretrained"],
        scale=RUN.scale,
        claims=DUALREFORM["claims"],
        claims_not_measured=DUALREFORM["claims_not_measured"],
        code=code_param("lm", "workflows/dualreform/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
