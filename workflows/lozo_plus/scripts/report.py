import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.lozo_plus.claims import build_report


def frames(job, name):
    return pd.concat([pd.read_csv(p) for p in job.keyed(name).values()], ignore_index=True)


def pretrained_runs(job):
    """The real pretrained model's frames (cpu scale, `pretrained_cpu`), None where it does not run."""
    if not job.params.pretrained_cpu:
        return None
    evals = pd.concat([read_frame(p)[0] for p in job.keyed("lm_eval").values()], ignore_index=True)
    named = {"curves": "lm_curve", "summaries": "lm_summary", "align": "lm_align"}
    return {key: frames(job, name) for key, name in named.items()} | {"evals": evals}


with snakemake_job(snakemake) as job:
    report = build_report(
        curves=frames(job, "curve"),
        logs=frames(job, "log"),
        align=frames(job, "align"),
        final=read_frame(job.input.final)[0],
        history=pd.read_csv(job.input.history),
        params=dict(job.params.items()),
        lm=pretrained_runs(job),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
