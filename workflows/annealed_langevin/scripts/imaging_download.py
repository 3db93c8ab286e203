from paperflow.annealed_langevin.imaging_data import fetch_pinned
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    for name, out in job.output.items():
        fetch_pinned(name, dict(job.params.sources[name]), out)
