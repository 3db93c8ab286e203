from paperflow.core.job import snakemake_job
from paperflow.uka.paper import download_data

with snakemake_job(snakemake) as job:
    counts = download_data(job.params.data, {"train": job.output.train, "test": job.output.test})
    job.note(dialogues=counts)
