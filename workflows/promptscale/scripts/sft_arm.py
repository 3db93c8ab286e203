from paperflow.core.job import snakemake_job
from paperflow.promptscale.sft_arm import sft_job

with snakemake_job(snakemake) as job:
    p = job.params
    summary = sft_job(
        job.input.start,
        job.input.traces,
        p.settings,
        p.device,
        p.n_procs,
        job.output.model,
        job.output.history,
        checkpoint_dir=str(job.checkpoint_dir()),  # TRL saves there every 30 min and a rerun resumes
    )
    job.note(seeds=[p.settings["seed"]], **summary)
