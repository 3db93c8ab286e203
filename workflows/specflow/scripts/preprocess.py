from paperflow.core.job import snakemake_job
from paperflow.specflow.stages import preprocess, read_task, write_task

with snakemake_job(snakemake) as job:
    p = job.params
    data = preprocess(read_task(job.input[0]), p.data["image"], p.data["count"]["max_objects"])
    write_task(job.output[0], data)
    job.note(n_patches=int(data["covers"].shape[1]))
