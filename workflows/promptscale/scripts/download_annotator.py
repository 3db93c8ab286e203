from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import download_model

with snakemake_job(snakemake) as job:
    name = job.wildcards.annotator
    spec, key = job.params.spec, f"annotate.annotators.{name}.revision"
    doc = download_model(f"annotator_{name}", spec, job.params.cache, job.output[0], key=key)
    job.note(hub=doc["hub"], revision=doc["revision"])
