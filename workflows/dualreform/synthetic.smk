# dualreform at smoke and tiny scale: SynthConvQA, the tiny CQR model built from a config, its SFT stage per seed.


DUALREFORM_PREFERENCE = ["retpo", "dualreform", "single_role", "raw_ref", "random_ref"]
DUALREFORM_ONE_ROUND = [m for m in ("retpo", "single_role", "raw_ref", "random_ref") if m in DUALREFORM["methods"]]
DUALREFORM_WILDCARDS = {
    "one_round": "|".join(DUALREFORM_ONE_ROUND) or "^$",
    "method": "|".join(DUALREFORM["methods"]),
}
DUALREFORM_TRAIN = {k: DUALREFORM[k] for k in ("sft", "dpo", "iterations", "generation", "bm25", "tiebreak_seed")}
DUALREFORM_EVAL = {k: DUALREFORM[k] for k in ("generation", "bm25", "tiebreak_seed")}


rule dualreform_download:
    output:
        passages=dualreform_path("raw", "passages.parquet"),
        turns=dualreform_path("raw", "turns.parquet"),
    log:
        dualreform_path("logs", "download.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=DUALREFORM["source"],
        world=DUALREFORM["world"],
        world_seed=DUALREFORM["world_seed"],
        code=code_param("base", "workflows/dualreform/scripts/download.py"),
    script:
        "scripts/download.py"


rule dualreform_preprocess:
    input:
        passages=dualreform_path("raw", "passages.parquet"),
        turns=dualreform_path("raw", "turns.parquet"),
    output:
        dualreform_path("data", "candidates.parquet"),
    log:
        dualreform_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        bm25=DUALREFORM["bm25"],
        teacher_seed=DUALREFORM["teacher_seed"],
        teacher_error_rate=DUALREFORM["teacher_error_rate"],
        tiebreak_seed=DUALREFORM["tiebreak_seed"],
        code=code_param("lm", "workflows/dualreform/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule dualreform_sft:
    input:
        table=dualreform_path("data", "candidates.parquet"),
        passages=dualreform_path("raw", "passages.parquet"),
    output:
        checkpoint=dualreform_path("models", "sft_human", "seed{seed}.safetensors"),
        history=dualreform_path("models", "sft_human", "history_seed{seed}.csv"),
    log:
        dualreform_path("logs", "sft", "seed{seed}.log"),
    benchmark:
        dualreform_path("benchmarks", "sft_seed{seed}.tsv")
    wildcard_constraints:
        seed="|".join(map(str, DUALREFORM["seeds"])),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", DUALREFORM, stage="train"),
    params:
        model=DUALREFORM["model"],
        sft=DUALREFORM["sft_human"],
        code=code_param("lm", "workflows/dualreform/scripts/sft.py"),
    script:
        "scripts/sft.py"


rule dualreform_train:
    input:
        unpack(lambda wc: keyed("sft", {s: p for (s, _), p in dualreform_checkpoints("sft_human").items()})),
        table=dualreform_path("data", "candidates.parquet"),
        passages=dualreform_path("raw", "passages.parquet"),
    output:
        checkpoints=[dualreform_path("models", "{method}", f"seed{s}_it1.safetensors") for s in DUALREFORM["seeds"]],
        history=dualreform_path("models", "{method}", "history.csv"),
        refs=dualreform_path("models", "{method}", "refs.parquet"),
    log:
        dualreform_path("logs", "train", "{method}.log"),
    benchmark:
        dualreform_path("benchmarks", "train_{method}.tsv")
    wildcard_constraints:
        method=DUALREFORM_WILDCARDS["one_round"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", DUALREFORM, stage="train"),
    params:
        seeds=DUALREFORM["seeds"],
        settings=DUALREFORM_TRAIN,
        code=code_param("lm", "workflows/dualreform/scripts/train.py"),
    script:
        "scripts/train.py"


rule dualreform_train_iterated:
    input:
        unpack(lambda wc: keyed("sft", {s: p for (s, _), p in dualreform_checkpoints("sft_human").items()})),
        table=dualreform_path("data", "candidates.parquet"),
        passages=dualreform_path("raw", "passages.parquet"),
    output:
        checkpoints=list(dualreform_checkpoints("dualreform").values()),
        history=dualreform_path("models", "dualreform", "history.csv"),
        refs=dualreform_path("models", "dualreform", "refs.parquet"),
    log:
        dualreform_path("logs", "train", "dualreform.log"),
    benchmark:
        dualreform_path("benchmarks", "train_dualreform.tsv")
    priority: 10  # the longest job: start it before the other methods' jobs
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", DUALREFORM, stage="train"),
    params:
        method="dualreform",
        seeds=DUALREFORM["seeds"],
        settings=DUALREFORM_TRAIN,
        code=code_param("lm", "workflows/dualreform/scripts/train.py"),
    script:
        "scripts/train.py"


rule dualreform_evaluate:
    input:
        unpack(lambda wc: keyed("ckpt", dualreform_checkpoints(wc.method))),
        table=dualreform_path("data", "candidates.parquet"),
        passages=dualreform_path("raw", "passages.parquet"),
    output:
        dualreform_path("eval", "{method}.parquet"),
    log:
        dualreform_path("logs", "evaluate", "{method}.log"),
    benchmark:
        dualreform_path("benchmarks", "evaluate_{method}.tsv")
    wildcard_constraints:
        method=DUALREFORM_WILDCARDS["method"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=DUALREFORM["seeds"],
        settings=DUALREFORM_EVAL,
        code=code_param("lm", "workflows/dualreform/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule dualreform_report:
    input:
        unpack(dualreform_report_inputs),
        table=dualreform_path("data", "candidates.parquet"),
    output:
        report=dualreform_path("report.md"),
        metrics=dualreform_path("metrics.json"),
        metrics_table=dualreform_path("metrics.parquet"),
        table_retrieval=report(
            dualreform_path("tables", "retrieval.csv"), category="dualreform", labels={"table": "retrieval"}
        ),
        figure_mrr=report(dualreform_path("figures", "mrr.png"), category="dualreform", labels={"figure": "MRR"}),
        figure_refs=report(
            dualreform_path("figures", "pseudo_refs.png"),
            category="dualreform",
            labels={"figure": "pseudo-reference accuracy"},
        ),
    log:
        dualreform_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=DUALREFORM["seeds"],
        methods=DUALREFORM["methods"],
        iterations=DUALREFORM["iterations"],
        scale=RUN.scale,
        claims=DUALREFORM["claims"],
        claims_not_measured=DUALREFORM["claims_not_measured"],
        code=code_param("lm", "workflows/dualreform/scripts/report.py"),
    script:
        "scripts/report.py"
