from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import download

with snakemake_job(snakemake) as job:
    p = job.params
    frame = download(p.source, p.data, job.output[0])
    job.note(seeds=[p.data["seed"]], n_items=frame["split"].value_counts().to_dict())
