from paperflow.core.job import snakemake_job
from paperflow.itpo.stages import download

with snakemake_job(snakemake) as job:
    p = job.params
    sizes = download(p.source, p.task, job.output.eval_tasks, job.output.analysis_tasks)
    job.note(seeds=[p.task["eval_seed"], p.task["analysis_seed"]], **sizes)
