from paperflow.core.job import snakemake_job
from paperflow.specflow.paper import score_benchmark

with snakemake_job(snakemake) as job:
    frame = score_benchmark(job.keyed("answers", types=(str, int)))
    frame.to_csv(job.output[0], index=False)
    job.note(scores={f"{r.method}@{r.budget}": float(r.score) for r in frame.itertuples()})
