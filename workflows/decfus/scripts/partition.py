from paperflow.core.job import snakemake_job
from paperflow.core.keys import unkey
from paperflow.decfus.prepare import partition

with snakemake_job(snakemake) as job:
    outputs = unkey(job.output, "split", types=(int,))
    sizes = {s: partition(job.input[0], job.params.clients, dict(job.params.spec), s, outputs[s]) for s in outputs}
    job.note(seeds=list(job.params.seeds), client_sizes=sizes)
