import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.spaef.claims import build_report

with snakemake_job(snakemake) as job:
    metrics = pd.concat(read_frame(path)[0] for path in job.keyed("metrics").values())
    graphs = job.keyed("graphs", types=(str, int))
    histories = job.keyed("history", types=(str, int, str))
    report = build_report(
        metrics=metrics,
        graph_quality=[dict(read_frame(path)[1], sample=sample) for (sample, _seed), path in graphs.items()],
        histories=pd.concat(pd.read_csv(path).assign(sample=sample) for (sample, _, _), path in histories.items()),
        plot_inputs=dict(
            adata=job.input.plot_adata,
            baselines=job.input.plot_baselines,
            denoised=job.keyed("plot_denoised"),
        ),
        params=dict(job.params.items()),
        scale=job.scale,
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
