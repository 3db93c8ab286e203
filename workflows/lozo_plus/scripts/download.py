from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.prepare import download

with snakemake_job(snakemake) as job:
    p = job.params
    frame = download(p.source, p.data, job.output[0])
    job.note(seeds=[p.data["seed"]], rows=frame.groupby("split").size().to_dict())
