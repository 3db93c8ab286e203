from paperflow.core.job import snakemake_job
from paperflow.promptscale.prepare import download

with snakemake_job(snakemake) as job:
    frame = download(job.params.source, job.params.world, job.output[0])
    job.note(seeds=[job.params.world["seed"]], items=frame.groupby("split").size().to_dict())
