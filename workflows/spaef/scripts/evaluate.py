from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.spaef.stages import evaluate_stage

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    denoised = job.keyed("denoised", types=(str, int))  # {(method, seed): path}
    frame = evaluate_stage(job.input.adata, denoised, job.input.baselines, seeds, job.params.evaluate)
    write_frame(job.output[0], frame.assign(sample=job.wildcards.sample), {"sample": job.wildcards.sample})
    job.note(seeds=seeds)
