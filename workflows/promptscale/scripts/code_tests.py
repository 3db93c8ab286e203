import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.code_selfplay import generate_tests
from paperflow.promptscale.llm_text import model_folder

with snakemake_job(snakemake) as job:
    p = job.params
    summary = generate_tests(
        model_folder(job.input.tester),
        job.input.synth,
        p.settings,
        p.vllm,
        p.dtype,
        job.output.tests,
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.settings["seed"] + r for r in range(p.settings["rounds"])], **summary)
