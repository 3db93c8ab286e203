from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.spaef.stages import evaluate_stage

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    paths = iter(job.input.denoised)  # method-major, seed-minor (see the rule)
    denoised = {(m, s): next(paths) for m in job.params.methods for s in seeds}
    frame = evaluate_stage(job.input.adata, denoised, job.input.baselines, seeds, job.params.evaluate)
    write_frame(job.output[0], frame.assign(sample=job.wildcards.sample), {"sample": job.wildcards.sample})
    job.note(seeds=seeds)
