import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.safer.claims import write_report

with snakemake_job(snakemake) as job:
    p = job.params
    keys = [d for d in p.datasets for _ in p.methods for _ in p.groups]  # the rule's input order
    accs = {d: pd.concat(read_frame(f)[0] for k, f in zip(keys, job.input.acc) if k == d) for d in p.datasets}
    opens = {d: pd.concat(read_frame(f)[0] for k, f in zip(keys, job.input.open) if k == d) for d in p.datasets}
    claims = write_report(accs=accs, opens=opens, params=dict(p.items()), out=dict(job.output.items()))
    job.note(seeds=p.seeds, claims_held={c.id: c.held for c in claims})
