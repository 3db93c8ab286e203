import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.dro_flow.claims import write_report

with snakemake_job(snakemake) as job:
    claims = write_report(
        frames={n: read_frame(p)[0] for n, p in zip(job.params.datasets, job.input.evals)},
        histories=pd.concat(pd.read_csv(p) for p in job.input.histories),
        params=dict(job.params.items()),
        out=dict(job.output.items()),
    )
    job.note(seeds=job.params.seeds, claims_held={c.id: c.held for c in claims})
