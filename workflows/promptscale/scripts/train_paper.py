from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import fine_tune_job

with snakemake_job(snakemake) as job:
    p = job.params
    summary = fine_tune_job(
        job.wildcards.which,
        int(job.wildcards.m),
        dict(job.input.items()),
        p.sft,
        p.device,
        p.n_procs,
        job.output.model,
        job.output.history,
        checkpoint_dir=str(job.checkpoint_dir()),  # TRL saves there every 30 min and a rerun resumes
    )
    job.note(seeds=[p.sft["seed"]], **summary)
