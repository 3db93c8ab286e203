from paperflow.core.job import snakemake_job
from paperflow.uka.paper import preprocess

with snakemake_job(snakemake) as job:
    raw = {"train": job.input.train, "test": job.input.test}
    cases = preprocess(raw, job.params.embedding, job.output.cases, job.output.embeddings)
    job.note(encoder=job.params.embedding["kind"], cases=cases.groupby("split").size().to_dict())
