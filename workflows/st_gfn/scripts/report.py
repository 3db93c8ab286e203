import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.st_gfn.claims import write_report

with snakemake_job(snakemake) as job:
    envs = list(job.params.envs)
    histories = pd.concat(
        read_frame(p)[0].assign(env=m["env"], method=m["method"])
        for p in job.input.histories
        for m in [read_frame(p)[1]]
    )
    targets = {e: read_frame(p) for e, p in zip(envs, job.input.targets)}
    claims = write_report(
        frames={e: read_frame(p)[0] for e, p in zip(envs, job.input.metrics)},
        pmfs={e: read_frame(p)[0] for e, p in zip(envs, job.input.pmfs)},
        targets={e: frame for e, (frame, _) in targets.items()},
        target_meta={e: meta for e, (_, meta) in targets.items()},
        histories=histories,
        params=dict(job.params.items()),
        out=dict(job.output.items()),
    )
    job.note(seeds=job.params.seeds, claims_held={c.id: c.held for c in claims})
