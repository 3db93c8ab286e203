from paperflow.core.job import snakemake_job
from paperflow.core.keys import unkey
from paperflow.mtbl_wc.prepare import preprocess

with snakemake_job(snakemake) as job:
    outs = unkey(job.output, "instance", types=(int,))
    preprocess(job.wildcards.problem, dict(job.params.spec), job.input[0], outs, job.params.front_points)
    job.note(seeds=sorted(outs))
