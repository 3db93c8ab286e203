from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.stages import download

with snakemake_job(snakemake) as job:
    p = job.params
    sql = download(p.source, p.world, job.output[0])
    job.note(seeds=[p.world["seed"]], sql_bytes=len(sql))
