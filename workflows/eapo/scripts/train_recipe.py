import sys

from paperflow.core.job import snakemake_job
from paperflow.eapo.recipes import train

with snakemake_job(snakemake) as job:
    p = job.params
    # verl's checkpoints in the job's folder: saved every save_freq steps, resumed by trainer.resume_mode=auto
    doc = train(
        p.method,
        p.seed,
        p.settings,
        dict(job.input.items()),
        job.output.model,
        python=sys.executable,
        checkpoints=job.checkpoint_dir(),
    )
    job.note(seeds=[p.seed], method=p.method, checkpoint=doc["checkpoint"])
