from paperflow.core.job import snakemake_job
from paperflow.spaef.embed import embed_stage

with snakemake_job(snakemake) as job:
    info = embed_stage(
        job.input.adata,
        job.input.sentences,
        dict(job.params.embedding),
        job.params.cache,
        job.output.spots,
        job.output.genes,
        job.output.ggi,
    )
    job.note(embeddings=info)
