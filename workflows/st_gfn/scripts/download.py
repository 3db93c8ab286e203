from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.st_gfn.envs import enumerate_states

with snakemake_job(snakemake) as job:
    spec = dict(job.params.spec)
    write_frame(job.output[0], enumerate_states(spec), {"env": job.wildcards.env, "spec": spec})
