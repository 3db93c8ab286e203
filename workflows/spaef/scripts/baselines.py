from paperflow.core.job import snakemake_job
from paperflow.spaef.stages import baselines_stage

with snakemake_job(snakemake) as job:
    baselines_stage(job.input[0], job.params.baselines, job.params.baseline, job.output[0])
