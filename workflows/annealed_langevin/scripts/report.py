import json

from paperflow.annealed_langevin.claims import write_report
from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    keys = [tuple(k) for k in job.params.run_keys]  # (target, path, T), in the order of input.curves
    curves = {k: read_frame(p)[0] for k, p in zip(keys, job.input.curves)}
    imaging = [json.loads(open(p).read()) for p in job.input.imaging]
    claims = write_report(curves=curves, imaging=imaging, params=dict(job.params.items()), out=dict(job.output.items()))
    job.note(seeds=job.params.seeds, claims_held={c.id: c.held for c in claims})
