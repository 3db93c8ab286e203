from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.mtbl_wc.arrays import load_npz
from paperflow.mtbl_wc.claims import write_report

with snakemake_job(snakemake) as job:
    names, seeds = list(job.params.problems), list(job.params.seeds)
    claims = write_report(
        frames={n: read_frame(p)[0] for n, p in zip(names, job.input.metrics)},
        curves={n: read_frame(p)[0] for n, p in zip(names, job.input.curves)},
        fronts={n: load_npz(p) for n, p in zip(names, job.input.fronts)},
        specs={n: dict(job.params.specs[n]) for n in names},
        params=dict(job.params.items()),
        out=dict(job.output.items()),
    )
    job.note(seeds=seeds, claims_held={c.id: c.held for c in claims})
