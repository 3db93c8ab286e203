# dualreform at smoke and tiny scale: SynthConvQA, the tiny CQR model built from a config, its SFT stage per seed.


DUALREFORM_PREFERENCE = ["retpo", "dualreform", "single_role", "raw_ref", "random_ref"]
DUALREFORM_ONE_ROUND = [m for m in ("retpo", "single_role", "raw_ref", "random_ref") if m in DUALREFORM["methods"]]
DUALREFORM_WILDCARDS = {
    "one_round": "|".join(DUALREFORM_ONE_ROUND) or "^$",
    "method": "|".join(DUALREFORM["methods"]),
}
DUALREFORM_TRAIN = {k: DUALREFORM[k] for k in ("sft", "dpo", "iterations", "generation", "bm25", "tiebreak_seed")}
DUALREFORM_EVAL = {k: DUALREFORM[k] for k in ("generation", "bm25", "tiebreak_seed")}


paper_stages(
    "dualreform",
    DUALREFORM,
    dualreform_path,
    stage(
        "download",
        script="download.py",
        env="base",
        resources=resources_of("cpu_light"),
        output={
            "passages": dualreform_path("raw", "passages.parquet"),
            "turns": dualreform_path("raw", "turns.parquet"),
        },
        reads=["source", "world", "world_seed"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "passages": dualreform_path("raw", "passages.parquet"),
            "turns": dualreform_path("raw", "turns.parquet"),
        },
        output=dualreform_path("data", "candidates.parquet"),
        reads=["bm25", "teacher_seed", "teacher_error_rate", "tiebreak_seed"],
    ),
    stage(
        "sft",
        script="sft.py",
        env="lm",
        resources=heavy_resources("train_gpu", DUALREFORM, stage="train"),
        input={
            "table": dualreform_path("data", "candidates.parquet"),
            "passages": dualreform_path("raw", "passages.parquet"),
        },
        output={
            "checkpoint": dualreform_path("models", "sft_human", "seed{seed}.safetensors"),
            "history": dualreform_path("models", "sft_human", "history_seed{seed}.csv"),
        },
        wildcards={"seed": "|".join(map(str, DUALREFORM["seeds"]))},
        tag="seed{seed}",
        benchmark=True,
        reads=["model"],
        params={"sft": DUALREFORM["sft_human"]},
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", DUALREFORM, stage="train"),
        unpack=lambda wc: keyed("sft", {s: p for (s, _), p in dualreform_checkpoints("sft_human").items()}),
        input={
            "table": dualreform_path("data", "candidates.parquet"),
            "passages": dualreform_path("raw", "passages.parquet"),
        },
        output={
            "checkpoints": [
                dualreform_path("models", "{method}", f"seed{s}_it1.safetensors") for s in DUALREFORM["seeds"]
            ],
            "history": dualreform_path("models", "{method}", "history.csv"),
            "refs": dualreform_path("models", "{method}", "refs.parquet"),
        },
        wildcards={"method": DUALREFORM_WILDCARDS["one_round"]},
        tag="{method}",
        benchmark=True,
        reads=["seeds"],
        params={"settings": DUALREFORM_TRAIN},
    ),
    stage(
        "train_iterated",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", DUALREFORM, stage="train"),
        unpack=lambda wc: keyed("sft", {s: p for (s, _), p in dualreform_checkpoints("sft_human").items()}),
        input={
            "table": dualreform_path("data", "candidates.parquet"),
            "passages": dualreform_path("raw", "passages.parquet"),
        },
        output={
            "checkpoints": list(dualreform_checkpoints("dualreform").values()),
            "history": dualreform_path("models", "dualreform", "history.csv"),
            "refs": dualreform_path("models", "dualreform", "refs.parquet"),
        },
        log_dir="train",
        tag="dualreform",
        benchmark=True,
        priority=10,  # the longest job: start it before the other methods' jobs
        reads=["seeds"],
        params={"method": "dualreform", "settings": DUALREFORM_TRAIN},
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=lambda wc: keyed("ckpt", dualreform_checkpoints(wc.method)),
        input={
            "table": dualreform_path("data", "candidates.parquet"),
            "passages": dualreform_path("raw", "passages.parquet"),
        },
        output=dualreform_path("eval", "{method}.parquet"),
        wildcards={"method": DUALREFORM_WILDCARDS["method"]},
        tag="{method}",
        benchmark=True,
        reads=["seeds"],
        params={"settings": DUALREFORM_EVAL},
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=dualreform_report_inputs,
        input={"table": dualreform_path("data", "candidates.parquet")},
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
            "figure_refs": report(
                dualreform_path("figures", "pseudo_refs.png"),
                category="dualreform",
                labels={"figure": "pseudo-reference accuracy"},
            ),
        },
        reads=["seeds", "methods", "iterations", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)
