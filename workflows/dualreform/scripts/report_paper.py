import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.dualreform.paper import read_table
from paperflow.dualreform.paper_report import build_report

with snakemake_job(snakemake) as job:
    refs = {}
    for (method, _), path in job.keyed("refs", types=(str, int)).items():
        refs.setdefault(method, []).append(read_frame(path)[0])
    report = build_report(
        evals=pd.concat([read_frame(p)[0] for p in job.keyed("eval", types=(str, int)).values()], ignore_index=True),
        refs={m: pd.concat(frames, ignore_index=True) for m, frames in refs.items()},
        table=read_table(job.input.table)[0],
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
