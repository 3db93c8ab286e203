from paperflow.core.job import snakemake_job
from paperflow.ph_vae.prepare import preprocess

with snakemake_job(snakemake) as job:
    preprocess(
        job.input[0],
        job.output.train,
        job.output.test,
        job.params.test_fraction,
        job.params.data_seed,
        job.params.rescale,
    )
    job.note(seeds=[job.params.data_seed])
