import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.llm_text import model_folder
from paperflow.promptscale.paper_generate import synthesize

with snakemake_job(snakemake) as job:
    p = job.params
    summary = synthesize(
        model_folder(job.input.p),
        job.input.heldout,
        job.wildcards.variant,
        p.synthesis,
        p.vllm,
        p.dtype,
        job.output.problems,
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.synthesis["seed"]], **summary)
