from paperflow.core.job import snakemake_job
from paperflow.itpo.paper import download_recipe

with snakemake_job(snakemake) as job:
    doc = download_recipe(job.params.recipe, job.params.cache, job.output[0])
    job.note(itpo=doc["itpo"]["commit"], verl=doc["verl"]["commit"], overlaid=len(doc["overlaid"]))
