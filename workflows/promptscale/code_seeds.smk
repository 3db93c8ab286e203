# promptscale at paper scale, included by paper.smk: the code domain's seeds, Codeforces statements annotated with
# concepts and rationales by instruct models (spec 2.2).
# With `code` in `seeds_data.domains`: the statements of `annotate.corpus` (open-r1/codeforces, downloaded by
# promptscale_download as format codeforces_statements), each annotator of `annotate.annotators` downloaded at its
# pinned commit and served by vLLM on its own GPUs (tensor parallel) for its deterministic share of the statements
# (paperflow.promptscale.annotate.assign), two chat requests per statement (concepts, then rationale); the kept
# triples of every annotator feed promptscale_preprocess (paper.smk), which splits them per domain. Without it, no
# job of this file is in the DAG.
# (The cross-key rules of the annotate block are checked when the config loads: promptscale.settings.check_paper.)
PROMPTSCALE_DOMAINS = list(PROMPTSCALE["seeds_data"].get("domains", ["math"]))
PROMPTSCALE_ANNOTATE = PROMPTSCALE.get("annotate", {})
PROMPTSCALE_ANNOTATORS = list(PROMPTSCALE_ANNOTATE["annotators"]) if "code" in PROMPTSCALE_DOMAINS else []


def promptscale_code_triples(wildcards):
    """The annotate jobs' triples that promptscale_preprocess merges (none unless code is a seed domain)."""
    return [promptscale_path("annotate", f"{a}.jsonl") for a in PROMPTSCALE_ANNOTATORS]


def promptscale_annotator(wildcards):
    return PROMPTSCALE_ANNOTATE["annotators"][wildcards.annotator]


rule promptscale_download_annotator:
    output:
        promptscale_path("models", "annotator_{annotator}.json"),
    log:
        promptscale_path("logs", "download_annotator_{annotator}.log"),
    wildcard_constraints:
        annotator="|".join(PROMPTSCALE_ANNOTATORS) or "(?!)",
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        spec=promptscale_annotator,
        locked=lambda wc: promptscale_locked("model", promptscale_annotator(wc)["hub"]),
        cache=PROMPTSCALE_CACHE,
        code=code_param("lm", "workflows/promptscale/scripts/download_annotator.py"),
    script:
        "scripts/download_annotator.py"


rule promptscale_annotate:
    input:
        model=promptscale_path("models", "annotator_{annotator}.json"),
        statements=promptscale_path("raw", f"{PROMPTSCALE_ANNOTATE.get('corpus', 'codeforces')}.jsonl"),
    output:
        triples=promptscale_path("annotate", "{annotator}.jsonl"),
        summary=promptscale_path("annotate", "{annotator}.json"),
    log:
        promptscale_path("logs", "annotate", "{annotator}.log"),
    benchmark:
        promptscale_path("benchmarks", "annotate_{annotator}.tsv")
    wildcard_constraints:
        annotator="|".join(PROMPTSCALE_ANNOTATORS) or "(?!)",
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources(
            "infer_gpu",
            PROMPTSCALE,
            stage="sample",
            gpus=lambda wc: int(promptscale_annotator(wc)["gpus"]),
        ),
    params:
        settings=PROMPTSCALE_ANNOTATE,
        vllm=PROMPTSCALE["vllm"],
        code=code_param("lm-serve", "workflows/promptscale/scripts/annotate.py"),
    script:
        "scripts/annotate.py"
