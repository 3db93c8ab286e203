import pandas as pd

from paperflow.core.io import read_array, read_frame
from paperflow.core.job import snakemake_job
from paperflow.ph_vae.claims import write_report

with snakemake_job(snakemake) as job:
    names = job.params.datasets
    histories = pd.concat(pd.read_csv(path).assign(dataset=path.split("/")[-3]) for path in job.input.histories)
    claims = write_report(
        frames={n: read_frame(p)[0] for n, p in zip(names, job.input.metrics)},
        samples={n: read_frame(p)[0] for n, p in zip(names, job.input.samples)},
        tests={n: read_array(p)[0] for n, p in zip(names, job.input.tests)},
        histories=histories,
        params=dict(job.params.items()),
        out=dict(job.output.items()),
    )
    job.note(seeds=job.params.seeds, claims_held={c.id: c.held for c in claims})
