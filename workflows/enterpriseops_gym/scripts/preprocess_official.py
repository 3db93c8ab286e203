from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import preprocess

with snakemake_job(snakemake) as job:
    for mode, path in job.keyed("raw").items():
        counts = preprocess(path, job.input.dbs, job.params.servers, job.output[mode])
        job.note(**{mode: counts})
