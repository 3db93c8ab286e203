# eapo at smoke, cpu and tiny scale (source.kind synthetic): the digit-world addition task, the SFT base, pi_E and
# every method per seed with TRL's GRPOTrainer and EAPO's rollout (the paper scale's trainer), evaluation and the
# report. Included by the Snakefile.
from paperflow.eapo.settings import GATED as EAPO_GATED_METHODS

EAPO_RL = {k: EAPO[k] for k in ("rl", "eapo", "prior")}
EAPO_GATED = [m for m in EAPO_GATED_METHODS if m in EAPO["methods"]]
EAPO_REPORT_ONLY = [m for m in EAPO["methods"] if m not in EAPO_GATED]
EAPO_WILDCARDS = {"gated": "|".join(EAPO_GATED) or "^$"}


rule eapo_download:
    output:
        eapo_path("raw", "test_problems.parquet"),
    log:
        eapo_path("logs", "download.log"),
    conda:
        env_file("lm")  # the digit world's module reaches the kit's tokenizer (transformers, imported lazily)
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        source=EAPO["source"],
        task=EAPO["task"],
        code=code_param("lm", "workflows/eapo/scripts/download.py"),
    script:
        "scripts/download.py"


rule eapo_preprocess:
    input:
        eapo_path("raw", "test_problems.parquet"),
    output:
        vocabulary=eapo_path("data", "vocabulary.json"),
    log:
        eapo_path("logs", "preprocess.log"),
    conda:
        env_file("lm")  # the digit world's module reaches the kit's tokenizer (transformers, imported lazily)
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        task=EAPO["task"],
        code=code_param("lm", "workflows/eapo/scripts/preprocess.py"),
    script:
        "scripts/preprocess.py"


rule eapo_sft_base:
    input:
        problems=eapo_path("raw", "test_problems.parquet"),
        vocabulary=eapo_path("data", "vocabulary.json"),
    output:
        checkpoint=eapo_path("models", "base.safetensors"),
        history=eapo_path("models", "base_history.csv"),
    log:
        eapo_path("logs", "sft_base.log"),
    benchmark:
        eapo_path("benchmarks", "sft_base.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", EAPO, stage="train"),
    params:
        task=EAPO["task"],
        model=EAPO["model"],
        sft=EAPO["sft"],
        code=code_param("lm", "workflows/eapo/scripts/sft_base.py"),
    script:
        "scripts/sft_base.py"


rule eapo_train_prior:
    input:
        problems=eapo_path("raw", "test_problems.parquet"),
        base=eapo_path("models", "base.safetensors"),
    output:
        checkpoint=eapo_path("models", "prior.safetensors"),
        curves=eapo_path("models", "prior_curves.csv"),
    log:
        eapo_path("logs", "train_prior.log"),
    benchmark:
        eapo_path("benchmarks", "train_prior.tsv")
    priority: 20  # on the critical path: every EAPO arm waits for pi_E
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", EAPO, stage="train"),
    params:
        task=EAPO["task"],
        settings=EAPO_RL,
        code=code_param("lm", "workflows/eapo/scripts/train_prior.py"),
    script:
        "scripts/train_prior.py"


rule eapo_train:
    input:
        unpack(eapo_prior_input),
        problems=eapo_path("raw", "test_problems.parquet"),
        base=eapo_path("models", "base.safetensors"),
    output:
        checkpoints=[eapo_path("models", "{method}", f"seed{s}.safetensors") for s in EAPO["seeds"]],
        curves=eapo_path("models", "{method}", "curves.csv"),
        mechanism=eapo_path("models", "{method}", "mechanism.csv"),
    log:
        eapo_path("logs", "train", "{method}.log"),
    benchmark:
        eapo_path("benchmarks", "train_{method}.tsv")
    wildcard_constraints:
        method=EAPO_WILDCARDS["gated"],
    priority: 10  # after pi_E and the report-only job
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", EAPO, stage="train"),
    params:
        task=EAPO["task"],
        settings=EAPO_RL,
        seeds=EAPO["seeds"],
        code=code_param("lm", "workflows/eapo/scripts/train.py"),
    script:
        "scripts/train.py"


rule eapo_train_report_only:
    input:
        problems=eapo_path("raw", "test_problems.parquet"),
        base=eapo_path("models", "base.safetensors"),
        prior=eapo_path("models", "prior.safetensors"),
    output:
        checkpoints=[
            eapo_path("models", m, f"seed{s}.safetensors") for m in EAPO_REPORT_ONLY for s in EAPO["report_seeds"]
        ],
        curves=[eapo_path("models", m, "curves.csv") for m in EAPO_REPORT_ONLY],
        mechanism=[eapo_path("models", m, "mechanism.csv") for m in EAPO_REPORT_ONLY],
    log:
        eapo_path("logs", "train", "report_only.log"),
    benchmark:
        eapo_path("benchmarks", "train_report_only.tsv")
    # the report-only arms in one job at their `report_seeds`: each is one short run, and a process start
    # (torch + transformers) costs about as much; a cluster profile can still run them apart by narrowing `methods`
    priority: 15  # the longest job once pi_E exists: start it first
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("train_gpu", EAPO, stage="train"),
    params:
        methods=EAPO_REPORT_ONLY,
        task=EAPO["task"],
        settings=EAPO_RL,
        seeds=EAPO["report_seeds"],
        code=code_param("lm", "workflows/eapo/scripts/train.py"),
    script:
        "scripts/train.py"


rule eapo_evaluate:
    input:
        unpack(eapo_all_checkpoints),
        problems=eapo_path("raw", "test_problems.parquet"),
    output:
        eapo_path("eval", "final.parquet"),
    log:
        eapo_path("logs", "evaluate.log"),
    benchmark:
        eapo_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **heavy_resources("infer_gpu", EAPO, stage="evaluate"),
    params:
        task=EAPO["task"],
        evaluation=EAPO["evaluation"],
        code=code_param("lm", "workflows/eapo/scripts/evaluate.py"),
    script:
        "scripts/evaluate.py"


rule eapo_report:
    input:
        unpack(eapo_report_inputs),
        final=eapo_path("eval", "final.parquet"),
        base_history=eapo_path("models", "base_history.csv"),
        prior_curves=eapo_path("models", "prior_curves.csv"),
    output:
        report=eapo_path("report.md"),
        metrics=eapo_path("metrics.json"),
        metrics_table=eapo_path("metrics.parquet"),
        table_auc=report(eapo_path("tables", "auc.csv"), category="eapo", labels={"table": "accuracy AUC"}),
        table_mechanism=report(eapo_path("tables", "mechanism.csv"), category="eapo", labels={"table": "injections"}),
        figure_accuracy=report(eapo_path("figures", "accuracy.png"), category="eapo", labels={"figure": "accuracy"}),
        figure_dynamics=report(
            eapo_path("figures", "dynamics.png"), category="eapo", labels={"figure": "entropy and injection rate"}
        ),
    log:
        eapo_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        methods=EAPO["methods"],
        seeds=EAPO["seeds"],
        report_seeds=EAPO["report_seeds"],
        rl=EAPO["rl"],
        eapo=EAPO["eapo"],
        sft=EAPO["sft"],
        prior=EAPO["prior"],
        evaluation=EAPO["evaluation"],
        scale=RUN.scale,
        claims=EAPO["claims"],
        claims_not_measured=EAPO["claims_not_measured"],
        code=code_param("lm", "workflows/eapo/scripts/report.py"),
    script:
        "scripts/report.py"
