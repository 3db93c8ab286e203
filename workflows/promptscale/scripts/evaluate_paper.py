import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.llm_text import model_folder
from paperflow.promptscale.paper_generate import evaluate_benchmark

with snakemake_job(snakemake) as job:
    p = job.params
    summary = evaluate_benchmark(
        model_folder(job.input.policy),
        job.wildcards.policy,
        job.input.rows,
        job.wildcards.benchmark,
        p.settings,
        p.vllm,
        p.dtype,
        job.output.graded,
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.settings["seed"]], **summary)
