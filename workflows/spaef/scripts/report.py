import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.spaef.claims import write_report

with snakemake_job(snakemake) as job:
    metrics = pd.concat(read_frame(p)[0] for p in job.input.metrics)
    quality = [dict(read_frame(p)[1], sample=p.split("/")[-2]) for p in job.input.graphs]
    histories = pd.concat(pd.read_csv(p).assign(sample=p.split("/")[-3]) for p in job.input.histories)
    claims = write_report(
        metrics=metrics,
        graph_quality=quality,
        histories=histories,
        plot_inputs=dict(
            adata=job.input.plot_adata,
            baselines=job.input.plot_baselines,
            denoised=dict(zip(("spaef", "spaef_nolm"), job.input.plot_denoised)),
        ),
        params=dict(job.params.items()),
        out=dict(job.output.items()),
    )
    job.note(seeds=job.params.seeds, claims_held={c.id: c.held for c in claims})
