from paperflow.core.job import snakemake_job
from paperflow.itpo.stages import write_vocabulary

with snakemake_job(snakemake) as job:
    words = write_vocabulary(job.input[0], job.output.vocabulary)
    job.note(vocabulary_size=len(words))
