from paperflow.core.job import snakemake_job
from paperflow.decfus.prepare import partition

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    sizes = {
        s: partition(job.input[0], job.params.clients, dict(job.params.spec), s, out)
        for s, out in zip(seeds, job.output)
    }
    job.note(seeds=seeds, client_sizes=sizes)
