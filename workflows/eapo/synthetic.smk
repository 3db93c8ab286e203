# eapo at smoke, cpu and tiny scale (source.kind synthetic): the digit-world addition task, the SFT base, pi_E and
# every method per seed with TRL's GRPOTrainer and EAPO's rollout (the paper scale's trainer), evaluation and the
# report. Included by the Snakefile.
from paperflow.eapo.settings import GATED as EAPO_GATED_METHODS

EAPO_RL = {k: EAPO[k] for k in ("rl", "eapo", "prior")}
EAPO_GATED = [m for m in EAPO_GATED_METHODS if m in EAPO["methods"]]
EAPO_REPORT_ONLY = [m for m in EAPO["methods"] if m not in EAPO_GATED]
EAPO_WILDCARDS = {"gated": "|".join(EAPO_GATED) or "^$"}


paper_stages(
    "eapo",
    EAPO,
    eapo_path,
    stage(
        "download",
        script="download.py",
        env="lm",  # the digit world's module reaches the kit's tokenizer (transformers, imported lazily)
        resources=resources_of("cpu_light"),
        output=eapo_path("raw", "test_problems.parquet"),
        reads=["source", "task"],
    ),
    stage(
        "preprocess",
        script="preprocess.py",
        env="lm",  # the digit world's module reaches the kit's tokenizer (transformers, imported lazily)
        resources=resources_of("cpu_light"),
        input=eapo_path("raw", "test_problems.parquet"),
        output={"vocabulary": eapo_path("data", "vocabulary.json")},
        reads=["task"],
    ),
    stage(
        "sft_base",
        script="sft_base.py",
        env="lm",
        resources=heavy_resources("train_gpu", EAPO, stage="train"),
        input={
            "problems": eapo_path("raw", "test_problems.parquet"),
            "vocabulary": eapo_path("data", "vocabulary.json"),
        },
        output={
            "checkpoint": eapo_path("models", "base.safetensors"),
            "history": eapo_path("models", "base_history.csv"),
        },
        benchmark=True,
        reads=["task", "model", "sft"],
    ),
    stage(
        "train_prior",
        script="train_prior.py",
        env="lm",
        resources=heavy_resources("train_gpu", EAPO, stage="train"),
        priority=20,  # on the critical path: every EAPO arm waits for pi_E
        input={
            "problems": eapo_path("raw", "test_problems.parquet"),
            "base": eapo_path("models", "base.safetensors"),
        },
        output={
            "checkpoint": eapo_path("models", "prior.safetensors"),
            "curves": eapo_path("models", "prior_curves.csv"),
        },
        benchmark=True,
        reads=["task"],
        params={"settings": EAPO_RL},
    ),
    stage(
        "train",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", EAPO, stage="train"),
        priority=10,  # after pi_E and the report-only job
        unpack=eapo_prior_input,
        input={
            "problems": eapo_path("raw", "test_problems.parquet"),
            "base": eapo_path("models", "base.safetensors"),
        },
        output={
            "checkpoints": [eapo_path("models", "{method}", f"seed{s}.safetensors") for s in EAPO["seeds"]],
            "curves": eapo_path("models", "{method}", "curves.csv"),
            "mechanism": eapo_path("models", "{method}", "mechanism.csv"),
        },
        wildcards={"method": EAPO_WILDCARDS["gated"]},
        tag="{method}",
        benchmark=True,
        reads=["task", "seeds"],
        params={"settings": EAPO_RL},
    ),
    # the report-only arms in one job at their `report_seeds`: each is one short run, and a process start
    # (torch + transformers) costs about as much; a cluster profile can still run them apart by narrowing `methods`
    stage(
        "train_report_only",
        script="train.py",
        env="lm",
        resources=heavy_resources("train_gpu", EAPO, stage="train"),
        priority=15,  # the longest job once pi_E exists: start it first
        input={
            "problems": eapo_path("raw", "test_problems.parquet"),
            "base": eapo_path("models", "base.safetensors"),
            "prior": eapo_path("models", "prior.safetensors"),
        },
        output={
            "checkpoints": [
                eapo_path("models", m, f"seed{s}.safetensors") for m in EAPO_REPORT_ONLY for s in EAPO["report_seeds"]
            ],
            "curves": [eapo_path("models", m, "curves.csv") for m in EAPO_REPORT_ONLY],
            "mechanism": [eapo_path("models", m, "mechanism.csv") for m in EAPO_REPORT_ONLY],
        },
        tag="report_only",
        log_dir="train",
        benchmark=True,
        reads=["task"],
        params={"methods": EAPO_REPORT_ONLY, "settings": EAPO_RL, "seeds": EAPO["report_seeds"]},
    ),
    stage(
        "evaluate",
        script="evaluate.py",
        env="lm",
        resources=heavy_resources("infer_gpu", EAPO, stage="evaluate"),
        unpack=eapo_all_checkpoints,
        input={"problems": eapo_path("raw", "test_problems.parquet")},
        output=eapo_path("eval", "final.parquet"),
        benchmark=True,
        reads=["task", "evaluation"],
    ),
    stage(
        "report",
        script="report.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=eapo_report_inputs,
        input={
            "final": eapo_path("eval", "final.parquet"),
            "base_history": eapo_path("models", "base_history.csv"),
            "prior_curves": eapo_path("models", "prior_curves.csv"),
        },
        output={
            "report": eapo_path("report.md"),
            "metrics": eapo_path("metrics.json"),
            "metrics_table": eapo_path("metrics.parquet"),
            "table_auc": report(eapo_path("tables", "auc.csv"), category="eapo", labels={"table": "accuracy AUC"}),
            "table_mechanism": report(
                eapo_path("tables", "mechanism.csv"), category="eapo", labels={"table": "injections"}
            ),
            "figure_accuracy": report(
                eapo_path("figures", "accuracy.png"), category="eapo", labels={"figure": "accuracy"}
            ),
            "figure_dynamics": report(
                eapo_path("figures", "dynamics.png"), category="eapo", labels={"figure": "entropy and injection rate"}
            ),
        },
        reads=[
            "methods",
            "seeds",
            "report_seeds",
            "rl",
            "eapo",
            "sft",
            "prior",
            "evaluation",
            "claims",
            "claims_not_measured",
        ],
        params={"scale": RUN.scale},
    ),
)
