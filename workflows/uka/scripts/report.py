import json

import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.uka.claims import build_report
from paperflow.uka.stages import read_user_table

with snakemake_job(snakemake) as job:
    with open(job.input.world) as fh:
        world = json.load(fh)
    report = build_report(
        per_user=pd.concat([read_frame(p)[0] for p in job.keyed("per_user").values()], ignore_index=True),
        per_turn=pd.concat([read_frame(p)[0] for p in job.keyed("per_turn").values()], ignore_index=True),
        attempts=pd.concat([pd.read_csv(p) for p in job.keyed("attempts").values()], ignore_index=True),
        world_meta=world,
        params=dict(job.params.items()),
        users=read_user_table(job.input.users),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
