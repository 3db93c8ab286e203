import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.st_gfn.report import build_report

with snakemake_job(snakemake) as job:
    histories = pd.concat(
        read_frame(path)[0].assign(env=env, method=method) for (env, method), path in job.keyed("history").items()
    )
    targets = {env: read_frame(path) for env, path in job.keyed("target").items()}
    report = build_report(
        frames={env: read_frame(path)[0] for env, path in job.keyed("metrics").items()},
        pmfs={env: read_frame(path)[0] for env, path in job.keyed("pmfs").items()},
        targets={env: frame for env, (frame, _) in targets.items()},
        target_meta={env: meta for env, (_, meta) in targets.items()},
        histories=histories,
        params=dict(job.params.items()),
        scale=job.scale,
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
