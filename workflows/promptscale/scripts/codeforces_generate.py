import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.codeforces import generate
from paperflow.promptscale.llm_text import model_folder

with snakemake_job(snakemake) as job:
    p = job.params
    summary = generate(
        model_folder(job.input.policy),
        job.wildcards.policy,
        job.input.problems,
        p.settings,
        p.vllm,
        p.dtype,
        job.output.submissions,
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.settings["seed"]], **{k: v for k, v in summary.items() if k != "elo"})
