from paperflow.core.job import snakemake_job
from paperflow.dualreform.paper import index_dense

with snakemake_job(snakemake) as job:
    shape = index_dense(
        job.input.passages, job.input.dense, job.params.dense, job.output[0], checkpoint=job.checkpoint_dir()
    )
    job.note(passages=int(shape[0]), dim=int(shape[1]))
