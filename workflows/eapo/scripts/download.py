from paperflow.core.job import snakemake_job
from paperflow.eapo.prepare import download

with snakemake_job(snakemake) as job:
    p = job.params
    frame = download(p.source, p.task, job.output[0])
    job.note(seeds=[p.task["test_seed"]], n_test=len(frame))
