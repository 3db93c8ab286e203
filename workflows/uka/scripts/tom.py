from paperflow.core.job import snakemake_job
from paperflow.uka.paper import backbone, tom

with snakemake_job(snakemake) as job:
    cfg = {**job.params.settings, "tom": job.params.tom, "seeds": job.params.seeds}
    with backbone(job.input.pretrained, cfg, job.log[0] + ".server") as client:
        doc = tom(client, cfg, job.output[0])
    job.note(seeds=job.params.seeds, unparsed=doc["unparsed"])
