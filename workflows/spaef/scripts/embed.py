from paperflow.core.job import snakemake_job
from paperflow.spaef.embed import embed_stage

with snakemake_job(snakemake) as job:
    info = {}
    for i, sample in enumerate(job.params.samples):  # inputs and outputs are in sample order (see the rule)
        info[sample] = embed_stage(job.input.adata[i], job.input.sentences[i], dict(job.params.embedding), job.params.cache,
                                   job.output.spots[i], job.output.genes[i], job.output.ggi[i])
    job.note(embeddings=info)
