# doubt at paper scale (source.kind benchmarks): each MLLM of `vlms`, the judge LLM, the sentence encoder and the NLI
# model at their pinned Hub commits (config, else config/locks/doubt.json, written by `paperflow pin doubt`), each
# benchmark of `benchmarks` likewise; per (MLLM, benchmark, seed) the answer sets sampled on GPUs (each MLLM's
# `gpus`, one node), labels (multiple choice on the CPU, free-form by the judge on a GPU), embeddings and the NLI
# entailment between answers on a GPU, the detectors on the CPU; evaluation and report. With vl_uncertainty in
# `methods`, VL-Uncertainty's perturbed prompts (questions rephrased by the judge LLM per benchmark, on a GPU), the
# MLLM's answers to them (blurred images, the MLLM's GPUs) and, on free-form benchmarks, their entailment (GPU).
from paperflow.core.download import read_lock_revisions
from paperflow.doubt import benchmarks as doubt_benchmarks
from paperflow.doubt.paper import VL_UNCERTAINTY as DOUBT_VLU

DOUBT_VLMS = list(DOUBT["vlms"])
DOUBT_BENCHES = list(DOUBT["benchmarks"])
DOUBT_CACHE = f"{RUN.resources}/doubt"
DOUBT_LOCK = read_lock_revisions("doubt", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
DOUBT_WILDCARDS = {
    "vlm": doubt_alternatives(DOUBT_VLMS),
    "bench": doubt_alternatives(DOUBT_BENCHES),
    "seed": r"\d+",
}
DOUBT_KIND = doubt_benchmarks.KIND_OF
DOUBT_MC = doubt_alternatives([b for b in DOUBT_BENCHES if DOUBT_KIND[b] == doubt_benchmarks.MULTI_CHOICE])
DOUBT_FF = doubt_alternatives([b for b in DOUBT_BENCHES if DOUBT_KIND[b] == doubt_benchmarks.FREE_FORM])
DOUBT_RUNS = [(v, b, s) for v in DOUBT_VLMS for b in DOUBT_BENCHES for s in DOUBT["seeds"]]
DOUBT_RUN_TAG = "{vlm}_{bench}_seed{seed}"  # the log and benchmark name of a per-(MLLM, benchmark, seed) job


paper_stages(
    "doubt",
    DOUBT,
    doubt_path,
    hub_model_stage(
        "doubt",
        "download_model",
        lambda wc: DOUBT["vlms"][wc.vlm],
        lambda wc: f"vlms.{wc.vlm}.revision",
        DOUBT_CACHE,
        doubt_path("models", "vlm_{vlm}.json"),
        resources=resources_of("cpu_medium", runtime=240),
        wildcards={"vlm": DOUBT_WILDCARDS["vlm"]},
        log="download_model_{vlm}.log",
        params={"locked": lambda wc: doubt_locked("model", DOUBT["vlms"][wc.vlm]["hub"])},
    ),
    hub_model_stage(
        "doubt",
        "download_judge",
        DOUBT["judge"],
        "judge.revision",
        DOUBT_CACHE,
        doubt_path("models", "judge.json"),
        resources=resources_of("cpu_medium", runtime=120),
        params={"locked": doubt_locked("model", DOUBT["judge"]["hub"])},
    ),
    hub_model_stage(
        "doubt",
        "download_encoder",
        DOUBT["encoder"],
        "encoder.revision",
        DOUBT_CACHE,
        doubt_path("models", "encoder.json"),
        resources=resources_of("cpu_light"),
        params={"locked": doubt_locked("model", DOUBT["encoder"]["hub"])},
    ),
    stage(
        "download",
        script="download_benchmark.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=120),
        output=doubt_path("raw", "{bench}.parquet"),
        wildcards={"bench": DOUBT_WILDCARDS["bench"]},
        log="download_{bench}.log",
        params={
            "bench": lambda wc: DOUBT["benchmarks"][wc.bench],
            "locked": lambda wc: doubt_locked("dataset", DOUBT["benchmarks"][wc.bench]["hub"]),
            "cache": DOUBT_CACHE,
        },
    ),
    stage(
        "preprocess",
        script="preprocess_benchmark.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=doubt_path("raw", "{bench}.parquet"),
        output=doubt_path("data", "{bench}.parquet"),
        wildcards={"bench": DOUBT_WILDCARDS["bench"]},
        log="preprocess_{bench}.log",
        params={"limit": lambda wc: DOUBT["benchmarks"][wc.bench]["limit"]},
    ),
    stage(
        "sample",
        script="sample_vlm.py",
        env="lm",
        threads=4,
        # one node, one task: a sharded model's GPUs are on one machine
        resources={
            **heavy_resources("infer_gpu", DOUBT, stage="sample", gpus=doubt_vlm_gpus),
            "nodes": 1,
            "tasks": 1,
        },
        input={
            "vlm": doubt_path("models", "vlm_{vlm}.json"),
            "questions": doubt_path("data", "{bench}.parquet"),
        },
        output=doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        wildcards=DOUBT_WILDCARDS,
        tag=DOUBT_RUN_TAG,
        benchmark=True,
        reads=["sampling"],
        params={"spec": lambda wc: DOUBT["vlms"][wc.vlm]},
    ),
    stage(
        "label",
        script="label.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "raw": doubt_path("raw", "{bench}.parquet"),
            "samples": doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        },
        output=doubt_path("labels", "{vlm}", "{bench}_seed{seed}.parquet"),
        wildcards={"vlm": DOUBT_WILDCARDS["vlm"], "bench": DOUBT_MC, "seed": r"\d+"},
        tag=DOUBT_RUN_TAG,
    ),
    stage(
        "judge",
        script="judge.py",
        env="lm",
        threads=4,
        resources=heavy_resources("infer_gpu", DOUBT, stage="judge"),
        input={
            "judge": doubt_path("models", "judge.json"),
            "raw": doubt_path("raw", "{bench}.parquet"),
            "samples": doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        },
        output=doubt_path("labels", "{vlm}", "{bench}_seed{seed}.parquet"),
        wildcards={"vlm": DOUBT_WILDCARDS["vlm"], "bench": DOUBT_FF, "seed": r"\d+"},
        tag=DOUBT_RUN_TAG,
        benchmark=True,
        params={"spec": DOUBT["judge"]},
    ),
    stage(
        "embed",
        script="embed_answers.py",
        env="lm",
        threads=4,
        resources=heavy_resources("infer_gpu", DOUBT, stage="embed"),
        input={
            "encoder": doubt_path("models", "encoder.json"),
            "questions": doubt_path("data", "{bench}.parquet"),
            "samples": doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        },
        output=doubt_path("embeddings", "{vlm}", "{bench}_seed{seed}.parquet"),
        wildcards=DOUBT_WILDCARDS,
        tag=DOUBT_RUN_TAG,
        benchmark=True,
        params={"spec": DOUBT["encoder"]},
    ),
)

if "nli" in DOUBT:
    paper_stages(
        "doubt",
        DOUBT,
        doubt_path,
        hub_model_stage(
            "doubt",
            "download_nli",
            DOUBT["nli"],
            "nli.revision",
            DOUBT_CACHE,
            doubt_path("models", "nli.json"),
            resources=resources_of("cpu_medium", runtime=60),
            params={"locked": doubt_locked("model", DOUBT["nli"]["hub"])},
        ),
        stage(
            "entail",
            script="entail_answers.py",
            env="lm",
            threads=4,
            resources=heavy_resources("infer_gpu", DOUBT, stage="entail"),
            input={
                "nli": doubt_path("models", "nli.json"),
                "questions": doubt_path("data", "{bench}.parquet"),
                "samples": doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
            },
            output=doubt_path("entailment", "{vlm}", "{bench}_seed{seed}.parquet"),
            wildcards=DOUBT_WILDCARDS,
            tag=DOUBT_RUN_TAG,
            benchmark=True,
            params={"spec": DOUBT["nli"]},
        ),
    )

if DOUBT_VLU in DOUBT["methods"]:
    paper_stages(
        "doubt",
        DOUBT,
        doubt_path,
        stage(
            "rephrase",
            script="rephrase.py",
            env="lm",
            threads=4,
            resources=heavy_resources("infer_gpu", DOUBT, stage="rephrase"),
            input={
                "judge": doubt_path("models", "judge.json"),
                "questions": doubt_path("data", "{bench}.parquet"),
            },
            output=doubt_path("vlu_prompts", "{bench}_seed{seed}.parquet"),
            wildcards={"bench": DOUBT_WILDCARDS["bench"], "seed": r"\d+"},
            tag="{bench}_seed{seed}",
            benchmark=True,
            params={"spec": DOUBT["judge"], "vlu": DOUBT["vl_uncertainty"]},
        ),
        stage(
            "sample_perturbed",
            script="sample_perturbed.py",
            env="lm",
            threads=4,
            resources={
                **heavy_resources("infer_gpu", DOUBT, stage="sample", gpus=doubt_vlm_gpus),
                "nodes": 1,
                "tasks": 1,
            },
            input={
                "vlm": doubt_path("models", "vlm_{vlm}.json"),
                "questions": doubt_path("data", "{bench}.parquet"),
                "prompts": doubt_path("vlu_prompts", "{bench}_seed{seed}.parquet"),
            },
            output=doubt_path("vlu_samples", "{vlm}", "{bench}_seed{seed}.parquet"),
            wildcards=DOUBT_WILDCARDS,
            tag=DOUBT_RUN_TAG,
            benchmark=True,
            params={"spec": lambda wc: DOUBT["vlms"][wc.vlm], "vlu": DOUBT["vl_uncertainty"]},
        ),
        stage(
            "entail_perturbed",
            script="entail_perturbed.py",
            env="lm",
            threads=4,
            resources=heavy_resources("infer_gpu", DOUBT, stage="entail"),
            input={
                "nli": doubt_path("models", "nli.json"),
                "questions": doubt_path("data", "{bench}.parquet"),
                "perturbed": doubt_path("vlu_samples", "{vlm}", "{bench}_seed{seed}.parquet"),
            },
            output=doubt_path("vlu_entailment", "{vlm}", "{bench}_seed{seed}.parquet"),
            wildcards={"vlm": DOUBT_WILDCARDS["vlm"], "bench": DOUBT_FF, "seed": r"\d+"},
            tag=DOUBT_RUN_TAG,
            benchmark=True,
            params={"spec": DOUBT["nli"]},
        ),
    )

paper_stages(
    "doubt",
    DOUBT,
    doubt_path,
    stage(
        "score",
        script="score_answers.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=doubt_score_inputs,
        output=doubt_path("scores", "{vlm}", "{bench}_seed{seed}", "{method}.parquet"),
        wildcards={**DOUBT_WILDCARDS, "method": "|".join(DOUBT["methods"])},
        tag=DOUBT_RUN_TAG + "_{method}",
        reads=["scoring"],
    ),
    stage(
        "evaluate",
        script="evaluate_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            **keyed("labels", {(v, b, s): doubt_path("labels", v, f"{b}_seed{s}.parquet") for v, b, s in DOUBT_RUNS}),
            **keyed(
                "scores",
                {
                    (v, b, s, m): doubt_path("scores", v, f"{b}_seed{s}", f"{m}.parquet")
                    for v, b, s in DOUBT_RUNS
                    for m in DOUBT["methods"]
                },
            ),
        },
        output=doubt_path("eval", "metrics.parquet"),
        benchmark=True,
    ),
    stage(
        "report",
        script="report_paper.py",
        env="lm",  # its modules reach the benchmark readers (huggingface_hub)
        resources=resources_of("cpu_light"),
        input={"metrics": doubt_path("eval", "metrics.parquet")},
        output={
            "report": doubt_path("report.md"),
            "metrics": doubt_path("metrics.json"),
            "metrics_table": doubt_path("metrics.parquet"),
            "table_detectors": report(
                doubt_path("tables", "detectors.csv"), category="doubt", labels={"table": "detectors"}
            ),
            "figure_auroc": report(doubt_path("figures", "auroc.png"), category="doubt", labels={"figure": "AUROC"}),
        },
        reads=["seeds", "sampling", "claims", "claims_not_measured"],
        params={"scale": RUN.scale},
    ),
)
