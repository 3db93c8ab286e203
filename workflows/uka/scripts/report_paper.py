import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.uka.paper_report import build_report

with snakemake_job(snakemake) as job:
    per_case = pd.concat([read_frame(p)[0] for p in job.keyed("per_case").values()], ignore_index=True)
    wins = [read_frame(p)[0] for p in job.keyed("wins").values()]
    wins = pd.concat(wins, ignore_index=True) if wins else pd.DataFrame()
    attempts = pd.concat([pd.read_csv(p) for p in job.keyed("attempts").values()], ignore_index=True)
    publish_job(job, build_report(per_case, wins, dict(job.params.items()), attempts))
    job.note(seeds=job.params.seeds)
