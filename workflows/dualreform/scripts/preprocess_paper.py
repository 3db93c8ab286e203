from paperflow.core.job import snakemake_job
from paperflow.dualreform.paper import preprocess

with snakemake_job(snakemake) as job:
    table = preprocess(
        job.input.passages,
        job.input.turns,
        job.params.bm25,
        job.threads,
        job.output[0],
        checkpoint=job.checkpoint_dir(),
    )
    job.note(turns=len(table))
