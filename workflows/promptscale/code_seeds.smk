# promptscale at paper scale, included by paper.smk: the code domain's seeds, Codeforces statements annotated with
# concepts and rationales by instruct models (spec 2.2).
# With `code` in `seeds_data.domains`: the statements of `annotate.corpus` (open-r1/codeforces, downloaded by
# promptscale_download as format codeforces_statements), each annotator of `annotate.annotators` downloaded at its
# pinned commit and served by vLLM on its own GPUs (tensor parallel) for its deterministic share of the statements
# (paperflow.promptscale.annotate.assign), two chat requests per statement (concepts, then rationale); the kept
# triples of every annotator feed promptscale_preprocess (paper.smk), which splits them per domain. Without it, no
# job of this file is in the DAG.
# (The cross-key rules of the annotate block are checked when the config loads: promptscale.settings.check_paper.)
# The annotators: none unless code is a seed domain (PROMPTSCALE_DOMAINS, paper.smk); the stages are declared only
# then, where the config check guarantees the annotate block.
PROMPTSCALE_ANNOTATORS = list(PROMPTSCALE["annotate"]["annotators"]) if "code" in PROMPTSCALE_DOMAINS else []

if "code" in PROMPTSCALE_DOMAINS:
    PROMPTSCALE_ANNOTATE = PROMPTSCALE["annotate"]

    paper_stages(
        "promptscale",
        PROMPTSCALE,
        promptscale_path,
        hub_model_stage(
            "promptscale",
            "download_annotator",
            promptscale_annotator,
            lambda wc: f"annotate.annotators.{wc.annotator}.revision",
            PROMPTSCALE_CACHE,
            promptscale_path("models", "annotator_{annotator}.json"),
            extra=lambda wc: {"role": f"annotator_{wc.annotator}"},
            resources=resources_of("cpu_medium", runtime=240),
            wildcards={"annotator": "|".join(PROMPTSCALE_ANNOTATORS)},
            log="download_annotator_{annotator}.log",
            params={"locked": lambda wc: promptscale_locked("model", promptscale_annotator(wc)["hub"])},
        ),
        stage(
            "annotate",
            script="annotate.py",
            env="lm-serve",
            resources=heavy_resources(
                "infer_gpu",
                PROMPTSCALE,
                stage="sample",
                gpus=lambda wc: int(promptscale_annotator(wc)["gpus"]),
            ),
            input={
                "model": promptscale_path("models", "annotator_{annotator}.json"),
                "statements": promptscale_path("raw", f"{PROMPTSCALE_ANNOTATE['corpus']}.jsonl"),
            },
            output={
                "triples": promptscale_path("annotate", "{annotator}.jsonl"),
                "summary": promptscale_path("annotate", "{annotator}.json"),
            },
            wildcards={"annotator": "|".join(PROMPTSCALE_ANNOTATORS)},
            tag="{annotator}",
            benchmark=True,
            threads=4,
            reads=["vllm"],
            params={"settings": PROMPTSCALE_ANNOTATE},
        ),
    )
