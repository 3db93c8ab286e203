import json

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.credal_dro.claims import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        frames={exp: read_frame(path)[0] for exp, path in job.keyed("metrics").items()},
        bulks={exp: json.loads(open(path).read()) for exp, path in job.keyed("bulks").items()},
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=sorted({s for v in job.params.seeds.values() for s in v}))
