# doubt at paper scale (source.kind benchmarks): each MLLM of `vlms`, the judge LLM, the sentence encoder and the NLI
# model at their pinned Hub commits (config, else config/locks/doubt.json, written by `paperflow pin doubt`), each
# benchmark of `benchmarks` likewise; per (MLLM, benchmark, seed) the answer sets sampled on GPUs (each MLLM's
# `gpus`, one node), labels (multiple choice on the CPU, free-form by the judge on a GPU), embeddings and the NLI
# entailment between answers on a GPU, the detectors on the CPU; evaluation and report. With vl_uncertainty in
# `methods`, VL-Uncertainty's perturbed prompts (questions rephrased by the judge LLM per benchmark, on a GPU), the
# MLLM's answers to them (blurred images, the MLLM's GPUs) and, on free-form benchmarks, their entailment (GPU).
import re

from paperflow.core.download import read_lock_revisions
from paperflow.doubt import benchmarks as doubt_benchmarks
from paperflow.doubt.paper import VL_UNCERTAINTY as DOUBT_VLU
from paperflow.doubt.paper import needs_entailment as doubt_needs_entailment

DOUBT_VLMS = list(DOUBT["vlms"])
DOUBT_BENCHES = list(DOUBT["benchmarks"])
DOUBT_CACHE = f"{RUN.resources}/doubt"
DOUBT_LOCK = read_lock_revisions("doubt", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns


def doubt_alternatives(names):
    return "|".join(re.escape(n) for n in names) or "(?!)"


DOUBT_WILDCARDS = {
    "vlm": doubt_alternatives(DOUBT_VLMS),
    "bench": doubt_alternatives(DOUBT_BENCHES),
    "seed": r"\d+",
}
DOUBT_KIND = doubt_benchmarks.KIND_OF
DOUBT_MC = doubt_alternatives([b for b in DOUBT_BENCHES if DOUBT_KIND[b] == doubt_benchmarks.MULTI_CHOICE])
DOUBT_FF = doubt_alternatives([b for b in DOUBT_BENCHES if DOUBT_KIND[b] == doubt_benchmarks.FREE_FORM])
DOUBT_RUNS = [(v, b, s) for v in DOUBT_VLMS for b in DOUBT_BENCHES for s in DOUBT["seeds"]]


def doubt_locked(repo_type, hub):
    return DOUBT_LOCK.get(f"{repo_type}:{hub}")


def doubt_vlm_gpus(wildcards):
    """The GPUs of one MLLM's sampling job: its `gpus` (several of one node for the 26B/72B models; the job shards
    the model over them), none where the paper block's resources ask for none."""
    return int(DOUBT["vlms"][wildcards.vlm].get("gpus", 1)) if DOUBT["resources"]["gpus"] else 0


def doubt_score_inputs(wildcards):
    """The detector's inputs: the sets, their embeddings, and for semantic entropy the entailment judge's output;
    VL-Uncertainty: its answers to the perturbed prompts, and on a free-form benchmark their entailment."""
    run = f"{wildcards.bench}_seed{wildcards.seed}.parquet"
    if wildcards.method == DOUBT_VLU:
        out = {
            "questions": doubt_path("data", f"{wildcards.bench}.parquet"),
            "perturbed": doubt_path("vlu_samples", wildcards.vlm, run),
        }
        if DOUBT_KIND[wildcards.bench] == doubt_benchmarks.FREE_FORM:
            out["entail"] = doubt_path("vlu_entailment", wildcards.vlm, run)
        return out
    out = {
        "questions": doubt_path("data", f"{wildcards.bench}.parquet"),
        "samples": doubt_path("samples", wildcards.vlm, run),
        "embeddings": doubt_path("embeddings", wildcards.vlm, run),
    }
    if doubt_needs_entailment(wildcards.method):
        out["entail"] = doubt_path("entailment", wildcards.vlm, run)
    return out


rule doubt_download_model:
    output:
        doubt_path("models", "vlm_{vlm}.json"),
    log:
        doubt_path("logs", "download_model_{vlm}.log"),
    wildcard_constraints:
        vlm=DOUBT_WILDCARDS["vlm"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        spec=lambda wc: DOUBT["vlms"][wc.vlm],
        key=lambda wc: f"vlms.{wc.vlm}",
        locked=lambda wc: doubt_locked("model", DOUBT["vlms"][wc.vlm]["hub"]),
        cache=DOUBT_CACHE,
        code=code_param("lm", "workflows/doubt/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule doubt_download_judge:
    output:
        doubt_path("models", "judge.json"),
    log:
        doubt_path("logs", "download_judge.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=120),
    params:
        spec=DOUBT["judge"],
        key="judge",
        locked=doubt_locked("model", DOUBT["judge"]["hub"]),
        cache=DOUBT_CACHE,
        code=code_param("lm", "workflows/doubt/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule doubt_download_encoder:
    output:
        doubt_path("models", "encoder.json"),
    log:
        doubt_path("logs", "download_encoder.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        spec=DOUBT["encoder"],
        key="encoder",
        locked=doubt_locked("model", DOUBT["encoder"]["hub"]),
        cache=DOUBT_CACHE,
        code=code_param("lm", "workflows/doubt/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule doubt_download:
    output:
        doubt_path("raw", "{bench}.parquet"),
    log:
        doubt_path("logs", "download_{bench}.log"),
    wildcard_constraints:
        bench=DOUBT_WILDCARDS["bench"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=120),
    params:
        bench=lambda wc: DOUBT["benchmarks"][wc.bench],
        locked=lambda wc: doubt_locked("dataset", DOUBT["benchmarks"][wc.bench]["hub"]),
        cache=DOUBT_CACHE,
        code=code_param("lm", "workflows/doubt/scripts/download_benchmark.py"),
    script:
        "scripts/download_benchmark.py"


rule doubt_preprocess:
    input:
        doubt_path("raw", "{bench}.parquet"),
    output:
        doubt_path("data", "{bench}.parquet"),
    log:
        doubt_path("logs", "preprocess_{bench}.log"),
    wildcard_constraints:
        bench=DOUBT_WILDCARDS["bench"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        limit=lambda wc: DOUBT["benchmarks"][wc.bench]["limit"],
        code=code_param("lm", "workflows/doubt/scripts/preprocess_benchmark.py"),
    script:
        "scripts/preprocess_benchmark.py"


rule doubt_sample:
    input:
        vlm=doubt_path("models", "vlm_{vlm}.json"),
        questions=doubt_path("data", "{bench}.parquet"),
    output:
        doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
    log:
        doubt_path("logs", "sample", "{vlm}_{bench}_seed{seed}.log"),
    benchmark:
        doubt_path("benchmarks", "sample_{vlm}_{bench}_seed{seed}.tsv")
    wildcard_constraints:
        **DOUBT_WILDCARDS,
    conda:
        env_file("lm")
    threads: 4
    resources:
        # one node, one task: a sharded model's GPUs are on one machine
        **heavy_resources("infer_gpu", DOUBT, stage="sample", gpus=doubt_vlm_gpus),
        nodes=1,
        tasks=1,
    params:
        spec=lambda wc: DOUBT["vlms"][wc.vlm],
        sampling=DOUBT["sampling"],
        code=code_param("lm", "workflows/doubt/scripts/sample_vlm.py"),
    script:
        "scripts/sample_vlm.py"


rule doubt_label:
    input:
        raw=doubt_path("raw", "{bench}.parquet"),
        samples=doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
    output:
        doubt_path("labels", "{vlm}", "{bench}_seed{seed}.parquet"),
    log:
        doubt_path("logs", "label", "{vlm}_{bench}_seed{seed}.log"),
    wildcard_constraints:
        vlm=DOUBT_WILDCARDS["vlm"],
        bench=DOUBT_MC,
        seed=r"\d+",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("lm", "workflows/doubt/scripts/label.py"),
    script:
        "scripts/label.py"


rule doubt_judge:
    input:
        judge=doubt_path("models", "judge.json"),
        raw=doubt_path("raw", "{bench}.parquet"),
        samples=doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
    output:
        doubt_path("labels", "{vlm}", "{bench}_seed{seed}.parquet"),
    log:
        doubt_path("logs", "judge", "{vlm}_{bench}_seed{seed}.log"),
    benchmark:
        doubt_path("benchmarks", "judge_{vlm}_{bench}_seed{seed}.tsv")
    wildcard_constraints:
        vlm=DOUBT_WILDCARDS["vlm"],
        bench=DOUBT_FF,
        seed=r"\d+",
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", DOUBT, stage="judge"),
    params:
        spec=DOUBT["judge"],
        code=code_param("lm", "workflows/doubt/scripts/judge.py"),
    script:
        "scripts/judge.py"


rule doubt_embed:
    input:
        encoder=doubt_path("models", "encoder.json"),
        questions=doubt_path("data", "{bench}.parquet"),
        samples=doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
    output:
        doubt_path("embeddings", "{vlm}", "{bench}_seed{seed}.parquet"),
    log:
        doubt_path("logs", "embed", "{vlm}_{bench}_seed{seed}.log"),
    benchmark:
        doubt_path("benchmarks", "embed_{vlm}_{bench}_seed{seed}.tsv")
    wildcard_constraints:
        **DOUBT_WILDCARDS,
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", DOUBT, stage="embed"),
    params:
        spec=DOUBT["encoder"],
        code=code_param("lm", "workflows/doubt/scripts/embed_answers.py"),
    script:
        "scripts/embed_answers.py"


if "nli" in DOUBT:

    rule doubt_download_nli:
        output:
            doubt_path("models", "nli.json"),
        log:
            doubt_path("logs", "download_nli.log"),
        conda:
            env_file("lm")
        threads: 1
        resources:
            **resources_of("cpu_medium", runtime=60),
        params:
            spec=DOUBT["nli"],
            key="nli",
            locked=doubt_locked("model", DOUBT["nli"]["hub"]),
            cache=DOUBT_CACHE,
            code=code_param("lm", "workflows/doubt/scripts/download_model.py"),
        script:
            "scripts/download_model.py"

    rule doubt_entail:
        input:
            nli=doubt_path("models", "nli.json"),
            questions=doubt_path("data", "{bench}.parquet"),
            samples=doubt_path("samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        output:
            doubt_path("entailment", "{vlm}", "{bench}_seed{seed}.parquet"),
        log:
            doubt_path("logs", "entail", "{vlm}_{bench}_seed{seed}.log"),
        benchmark:
            doubt_path("benchmarks", "entail_{vlm}_{bench}_seed{seed}.tsv")
        wildcard_constraints:
            **DOUBT_WILDCARDS,
        conda:
            env_file("lm")
        threads: 4
        resources:
            **heavy_resources("infer_gpu", DOUBT, stage="entail"),
        params:
            spec=DOUBT["nli"],
            code=code_param("lm", "workflows/doubt/scripts/entail_answers.py"),
        script:
            "scripts/entail_answers.py"


if DOUBT_VLU in DOUBT["methods"]:

    rule doubt_rephrase:
        input:
            judge=doubt_path("models", "judge.json"),
            questions=doubt_path("data", "{bench}.parquet"),
        output:
            doubt_path("vlu_prompts", "{bench}_seed{seed}.parquet"),
        log:
            doubt_path("logs", "rephrase", "{bench}_seed{seed}.log"),
        benchmark:
            doubt_path("benchmarks", "rephrase_{bench}_seed{seed}.tsv")
        wildcard_constraints:
            bench=DOUBT_WILDCARDS["bench"],
            seed=r"\d+",
        conda:
            env_file("lm")
        threads: 4
        resources:
            **heavy_resources("infer_gpu", DOUBT, stage="rephrase"),
        params:
            spec=DOUBT["judge"],
            vlu=DOUBT["vl_uncertainty"],
            code=code_param("lm", "workflows/doubt/scripts/rephrase.py"),
        script:
            "scripts/rephrase.py"

    rule doubt_sample_perturbed:
        input:
            vlm=doubt_path("models", "vlm_{vlm}.json"),
            questions=doubt_path("data", "{bench}.parquet"),
            prompts=doubt_path("vlu_prompts", "{bench}_seed{seed}.parquet"),
        output:
            doubt_path("vlu_samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        log:
            doubt_path("logs", "sample_perturbed", "{vlm}_{bench}_seed{seed}.log"),
        benchmark:
            doubt_path("benchmarks", "sample_perturbed_{vlm}_{bench}_seed{seed}.tsv")
        wildcard_constraints:
            **DOUBT_WILDCARDS,
        conda:
            env_file("lm")
        threads: 4
        resources:
            **heavy_resources("infer_gpu", DOUBT, stage="sample", gpus=doubt_vlm_gpus),
            nodes=1,
            tasks=1,
        params:
            spec=lambda wc: DOUBT["vlms"][wc.vlm],
            vlu=DOUBT["vl_uncertainty"],
            code=code_param("lm", "workflows/doubt/scripts/sample_perturbed.py"),
        script:
            "scripts/sample_perturbed.py"

    rule doubt_entail_perturbed:
        input:
            nli=doubt_path("models", "nli.json"),
            questions=doubt_path("data", "{bench}.parquet"),
            perturbed=doubt_path("vlu_samples", "{vlm}", "{bench}_seed{seed}.parquet"),
        output:
            doubt_path("vlu_entailment", "{vlm}", "{bench}_seed{seed}.parquet"),
        log:
            doubt_path("logs", "entail_perturbed", "{vlm}_{bench}_seed{seed}.log"),
        benchmark:
            doubt_path("benchmarks", "entail_perturbed_{vlm}_{bench}_seed{seed}.tsv")
        wildcard_constraints:
            vlm=DOUBT_WILDCARDS["vlm"],
            bench=DOUBT_FF,
            seed=r"\d+",
        conda:
            env_file("lm")
        threads: 4
        resources:
            **heavy_resources("infer_gpu", DOUBT, stage="entail"),
        params:
            spec=DOUBT["nli"],
            code=code_param("lm", "workflows/doubt/scripts/entail_perturbed.py"),
        script:
            "scripts/entail_perturbed.py"


rule doubt_score:
    input:
        unpack(doubt_score_inputs),
    output:
        doubt_path("scores", "{vlm}", "{bench}_seed{seed}", "{method}.parquet"),
    log:
        doubt_path("logs", "score", "{vlm}_{bench}_seed{seed}_{method}.log"),
    wildcard_constraints:
        **DOUBT_WILDCARDS,
        method="|".join(DOUBT["methods"]),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        scoring=DOUBT["scoring"],
        code=code_param("lm", "workflows/doubt/scripts/score_answers.py"),
    script:
        "scripts/score_answers.py"


rule doubt_evaluate:
    input:
        **keyed("labels", {(v, b, s): doubt_path("labels", v, f"{b}_seed{s}.parquet") for v, b, s in DOUBT_RUNS}),
        **keyed(
            "scores",
            {
                (v, b, s, m): doubt_path("scores", v, f"{b}_seed{s}", f"{m}.parquet")
                for v, b, s in DOUBT_RUNS
                for m in DOUBT["methods"]
            },
        ),
    output:
        doubt_path("eval", "metrics.parquet"),
    log:
        doubt_path("logs", "evaluate.log"),
    benchmark:
        doubt_path("benchmarks", "evaluate.tsv")
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        code=code_param("lm", "workflows/doubt/scripts/evaluate_paper.py"),
    script:
        "scripts/evaluate_paper.py"


rule doubt_report:
    input:
        metrics=doubt_path("eval", "metrics.parquet"),
    output:
        report=doubt_path("report.md"),
        metrics=doubt_path("metrics.json"),
        metrics_table=doubt_path("metrics.parquet"),
        table_detectors=report(doubt_path("tables", "detectors.csv"), category="doubt", labels={"table": "detectors"}),
        figure_auroc=report(doubt_path("figures", "auroc.png"), category="doubt", labels={"figure": "AUROC"}),
    log:
        doubt_path("logs", "report.log"),
    conda:
        env_file("lm")  # its modules reach the benchmark readers (huggingface_hub)
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds=DOUBT["seeds"],
        sampling=DOUBT["sampling"],
        scale=RUN.scale,
        claims=DOUBT["claims"],
        claims_not_measured=DOUBT["claims_not_measured"],
        code=code_param("lm", "workflows/doubt/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"
