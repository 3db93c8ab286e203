import pandas as pd

from paperflow.core.io import read_array, read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.ph_vae.claims import build_report

with snakemake_job(snakemake) as job:
    histories = pd.concat(
        pd.read_csv(path).assign(dataset=dataset) for (dataset, _decoder), path in job.keyed("history").items()
    )
    report = build_report(
        frames={name: read_frame(path)[0] for name, path in job.keyed("metrics").items()},
        samples={name: read_frame(path)[0] for name, path in job.keyed("samples").items()},
        tests={name: read_array(path)[0] for name, path in job.keyed("test").items()},
        histories=histories,
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
