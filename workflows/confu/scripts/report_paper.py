import pandas as pd

from paperflow.confu.paper import build_paper_report
from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job

with snakemake_job(snakemake) as job:
    p = job.params
    evals = pd.concat([read_frame(f)[0] for f in job.input.evals], ignore_index=True)
    plain = pd.concat([read_frame(f)[0].assign(target=read_frame(f)[1]["target"]) for f in job.input.plain])
    publish_job(job, build_paper_report(evals, plain.reset_index(drop=True), dict(p.items())))
    job.note(seeds=p.seeds)
