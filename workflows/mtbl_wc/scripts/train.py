from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.mtbl_wc.arrays import load_npz, save_npz
from paperflow.mtbl_wc.experiment import train

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    result = train(job.params.kind, job.wildcards.method, load_npz(job.input[0]), dict(job.params.solver), seed)
    save_npz(job.output.run, z_best=result.z_best, z_final=result.z_final)
    write_frame(job.output.history, result.history.assign(method=job.wildcards.method, seed=seed))
    job.note(seeds=[seed])
