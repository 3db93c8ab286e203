import json
from pathlib import Path

import pandas as pd

from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.itpo.paper_report import build_report, turn_table

with snakemake_job(snakemake) as job:
    runs = pd.DataFrame([json.loads(Path(p).read_text()) for p in job.keyed("summary").values()])
    turns = turn_table(job.keyed("turns", types=(str, str, str)))
    publish_job(job, build_report(runs, dict(job.params.items()), turns))
    job.note(seeds=job.params.seeds)
