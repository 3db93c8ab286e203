from paperflow.core.job import snakemake_job
from paperflow.decfus.prepare import partition

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    sizes = partition(job.input[0], job.params.clients, dict(job.params.spec), seed, job.output[0])
    job.note(seeds=[seed], client_sizes=sizes)
