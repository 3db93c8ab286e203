import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.code_selfplay import code_rollouts
from paperflow.promptscale.llm_text import model_folder

with snakemake_job(snakemake) as job:
    p = job.params
    summary = code_rollouts(
        model_folder(job.input.policy),
        job.input.tests,
        p.selfplay,
        p.vllm,
        p.dtype,
        job.output.rollouts,
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.selfplay["seed"]], **summary)
