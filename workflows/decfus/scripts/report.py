import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.decfus.claims import write_report

with snakemake_job(snakemake) as job:
    p = job.params
    keys = [(ds, part) for ds in p.datasets for part in p.partitions]  # the rule's input order
    frames = {key: read_frame(path)[0] for key, path in zip(keys, job.input.evals)}
    runs = [(part, m) for part in p.partitions for m in p.methods for _ in p.groups]  # the rule's input order
    curves = pd.concat(pd.read_csv(f).assign(partition=k[0], method=k[1]) for k, f in zip(runs, job.input.curves))
    clients = pd.concat(pd.read_csv(f).assign(partition=k[0], method=k[1]) for k, f in zip(runs, job.input.clients))
    claims = write_report(
        frames=frames, curves=curves, clients=clients, params=dict(p.items()), out=dict(job.output.items())
    )
    job.note(seeds=p.seeds, claims_held={c.id: c.held for c in claims})
