from paperflow.core.job import snakemake_job
from paperflow.promptscale.annotate import download_annotator

with snakemake_job(snakemake) as job:
    doc = download_annotator(job.wildcards.annotator, job.params.spec, job.params.cache, job.output[0])
    job.note(hub=doc["hub"], revision=doc["revision"])
