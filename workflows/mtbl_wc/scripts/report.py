from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.mtbl_wc.arrays import load_npz
from paperflow.mtbl_wc.claims import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        frames={name: read_frame(path)[0] for name, path in job.keyed("metrics").items()},
        curves={name: read_frame(path)[0] for name, path in job.keyed("curves").items()},
        fronts={name: load_npz(path) for name, path in job.keyed("front").items()},
        specs={name: dict(spec) for name, spec in job.params.specs.items()},
        seeds=list(job.params.seeds),
        scale=job.params.scale,
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
