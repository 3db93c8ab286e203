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
# resources.preprocess_<key> are optional keys (the paper block sets them): these defaults where they are absent
DUALREFORM_PREPROCESS = {
    key: DUALREFORM_RES[f"preprocess_{key}"] if f"preprocess_{key}" in DUALREFORM_RES else default
    for key, default in (("runtime_min", 60), ("mem_mb", 8000), ("threads", 1))
}
DUALREFORM_DENSE = DUALREFORM["dense"] if "dense" in DUALREFORM else None  # None: BM25 only
DUALREFORM_TABLE = dualreform_path("data", "turns.parquet")
DUALREFORM_INDEX = dualreform_path("data", "bm25_index", "paperflow-index.json")  # written last into the index folder


paper_stages(
    "dualreform",
    DUALREFORM,
    dualreform_path,
    hub_model_stage(
        "dualreform",
        "download_model",
        DUALREFORM["pretrained"],
        "pretrained.revision",
        DUALREFORM_CACHE,
        dualreform_path("models", "pretrained.json"),
        resources=resources_of("cpu_medium", runtime=120),
        params={"locked": dualreform_locked(DUALREFORM["pretrained"])},
    ),
    stage(
        "download",
        script="download_data.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=240, mem_mb=DUALREFORM_PREPROCESS["mem_mb"]),
        output={
            "passages": dualreform_path("raw", "passages.parquet"),
            "turns": dualreform_path("raw", "turns.parquet"),
        },
        reads=["data"],
        params={
            "locked": [dualreform_locked(DUALREFORM["data"][k]) for k in ("conversations", "corpus")],
            "cache": DUALREFORM_CACHE,
        },
    ),
    stage(
        "preprocess",
        script="preprocess_paper.py",
        env="lm",
        resources=resources_of(
            "cpu_medium", runtime=DUALREFORM_PREPROCESS["runtime_min"], mem_mb=DUALREFORM_PREPROCESS["mem_mb"]
        ),
        input={
            "passages": dualreform_path("raw", "passages.parquet"),
            "turns": dualreform_path("raw", "turns.parquet"),
        },
        output={"table": DUALREFORM_TABLE, "index": DUALREFORM_INDEX},
        threads=DUALREFORM_PREPROCESS["threads"],
        reads=["bm25"],
    ),
    stage(
        "train",
        script="train_paper.py",
        env="lm",
        resources=heavy_resources("train_gpu", DUALREFORM, stage="train"),
        input={
            "pretrained": dualreform_path("models", "pretrained.json"),
            "table": DUALREFORM_TABLE,
            "index": DUALREFORM_INDEX,
        },
        output={
            "checkpoints": [dualreform_path("models", "{method}", "seed{seed}_it1.safetensors")],
            "history": dualreform_path("models", "{method}", "history_seed{seed}.csv"),
            "refs": dualreform_path("models", "{method}", "refs_seed{seed}.parquet"),
        },
        wildcards={
            "method": "|".join(m for m in DUALREFORM_TRAINED if m != "dualreform") or "^$",
            "seed": DUALREFORM_WILDCARDS["seed"],
        },
        tag="{method}_seed{seed}",
        benchmark=True,
        threads=4,
        reads=["pretrained", "lora", "trl_sft", "trl_dpo", "iterations", "generation"],
    ),
    stage(
        "train_iterated",
        script="train_paper.py",
        env="lm",
        resources=heavy_resources("train_gpu", DUALREFORM, stage="train"),
        input={
            "pretrained": dualreform_path("models", "pretrained.json"),
            "table": DUALREFORM_TABLE,
            "index": DUALREFORM_INDEX,
        },
        output={
            "checkpoints": dualreform_rounds("dualreform", "{seed}"),
            "history": dualreform_path("models", "dualreform", "history_seed{seed}.csv"),
            "refs": dualreform_path("models", "dualreform", "refs_seed{seed}.parquet"),
        },
        wildcards={"seed": DUALREFORM_WILDCARDS["seed"]},
        log_dir="train",
        tag="dualreform_seed{seed}",
        benchmark=True,
        priority=10,  # the longest job
        threads=4,
        reads=["pretrained", "lora", "trl_sft", "trl_dpo", "iterations", "generation"],
        params={"method": "dualreform"},
    ),
    stage(
        "evaluate",
        script="evaluate_paper.py",
        env="lm",
        resources=heavy_resources("infer_gpu", DUALREFORM, stage="evaluate"),
        unpack=dualreform_eval_inputs,
        input={"table": DUALREFORM_TABLE, "index": DUALREFORM_INDEX},
        output=dualreform_path("eval", "{method}_seed{seed}.parquet"),
        wildcards={"method": DUALREFORM_WILDCARDS["method"], "seed": DUALREFORM_WILDCARDS["seed"]},
        tag="{method}_seed{seed}",
        benchmark=True,
        threads=4,
        reads=["pretrained", "generation"],
        params={"dense": DUALREFORM_DENSE},
    ),
    stage(
        "report",
        script="report_paper.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
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
            "table": DUALREFORM_TABLE,
        },
        output={
            "report": dualreform_path("report.md"),
            "metrics": dualreform_path("metrics.json"),
            "metrics_table": dualreform_path("metrics.parquet"),
            "table_retrieval": report(
                dualreform_path("tables", "retrieval.csv"), category="dualreform", labels={"table": "retrieval"}
            ),
            "figure_mrr": report(
                dualreform_path("figures", "mrr.png"), category="dualreform", labels={"figure": "MRR"}
            ),
        },
        reads=["seeds", "methods", "iterations", "pretrained", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)

if DUALREFORM_DENSE:
    # the dense retriever and its index of the corpus (when `dense` is set)
    paper_stages(
        "dualreform",
        DUALREFORM,
        dualreform_path,
        hub_model_stage(
            "dualreform",
            "download_dense",
            DUALREFORM_DENSE,
            "dense.revision",
            DUALREFORM_CACHE,
            dualreform_path("models", "dense.json"),
            resources=resources_of("cpu_medium", runtime=120),
            params={"locked": dualreform_locked(DUALREFORM_DENSE)},
        ),
        stage(
            "index_dense",
            script="index_dense.py",
            env="lm",
            resources=heavy_resources("infer_gpu", DUALREFORM, stage="index"),
            input={
                "passages": dualreform_path("raw", "passages.parquet"),
                "dense": dualreform_path("models", "dense.json"),
            },
            output=dualreform_path("data", "dense.npy"),
            benchmark=True,
            threads=4,
            reads=["dense"],
        ),
    )
