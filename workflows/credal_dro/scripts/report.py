import json

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.credal_dro.claims import write_report

with snakemake_job(snakemake) as job:
    exps = job.params.experiments
    claims = write_report(
        frames={e: read_frame(p)[0] for e, p in zip(exps, job.input.metrics)},
        bulks={e: json.loads(open(p).read()) for e, p in zip(exps, job.input.bulks)},
        params=dict(job.params.items()),
        out=dict(job.output.items()),
    )
    job.note(
        seeds=sorted({s for v in job.params.seeds.values() for s in v}), claims_held={c.id: c.held for c in claims}
    )
