import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.dualreform.claims import build_report
from paperflow.dualreform.stages import read_table

with snakemake_job(snakemake) as job:
    report = build_report(
        evals=pd.concat(read_frame(path)[0] for path in job.keyed("eval").values()),
        histories={m: pd.read_csv(path) for m, path in job.keyed("history").items()},
        refs={m: read_frame(path)[0] for m, path in job.keyed("refs").items()},
        table=read_table(job.input.table),
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
