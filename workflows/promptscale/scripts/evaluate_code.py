import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.code_eval import evaluate_code
from paperflow.promptscale.llm_text import model_folder

with snakemake_job(snakemake) as job:
    p = job.params
    summary = evaluate_code(
        model_folder(job.input.policy),
        job.wildcards.policy,
        job.input.rows,
        job.wildcards.code_benchmark,
        p.settings,
        p.limits,
        p.vllm,
        p.dtype,
        job.output.graded,
        job.log_file + ".vllm",
        job.threads,
        journal=job.checkpoint_dir() / "rows.jsonl",  # samples and graded problems; a rerun does only the rest
    )
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.settings["seed"]], **summary)
