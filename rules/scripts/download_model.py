# A model repo at its pinned Hub commit (paperflow.core.hub_download.download_model): the stage that
# rules/common.smk's hub_model_stage makes, for any paper.
from paperflow.core.hub_download import download_model
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    p = job.params
    doc = download_model(p.spec, slug=p.slug, key=p.key, cache=p.cache, out=job.output[0], extra=p.extra)
    job.note(hub=doc["hub"], revision=doc["revision"])
