from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.promptscale.stages import evaluate

with snakemake_job(snakemake) as job:
    models = job.keyed("model", types=(str, int))
    metrics, problems = evaluate(job.input.problems, models, {"synthesis": job.params.synthesis})
    metrics.to_csv(job.output.metrics, index=False)
    write_frame(job.output.synthesised, problems)
    job.note(seeds=sorted({s for _, s in models}), validity=metrics.groupby("variant")["validity"].mean().to_dict())
