from paperflow.core.job import snakemake_job
from paperflow.promptscale.llm_text import model_folder
from paperflow.promptscale.paper_generate import sample_rationales

with snakemake_job(snakemake) as job:
    p = job.params
    rows = sample_rationales(
        model_folder(job.input.q),
        job.input.train,
        job.input.heldout,
        int(job.wildcards.m),
        p.em,
        p.vllm,
        p.dtype,
        job.output[0],
        job.log_file + ".vllm",
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished prompts; a rerun asks only for the rest
    )
    job.note(rows=rows)
