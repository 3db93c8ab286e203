import pandas as pd

from paperflow.confu.claims import build_report
from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job

with snakemake_job(snakemake) as job:
    p = job.params
    frame = pd.concat([pd.read_parquet(f) for f in job.input.evals], ignore_index=True)
    history = pd.concat([pd.read_csv(f) for f in job.input.histories], ignore_index=True)
    drafts = pd.concat([pd.read_csv(f) for f in job.input.draft_histories], ignore_index=True)
    lm = None
    if "lm_evals" in job.input.keys():  # cpu scale: the real target's decodings (pretrained_cpu.smk)
        lm = (
            pd.concat([read_frame(f)[0] for f in job.input.lm_evals], ignore_index=True),
            pd.concat(
                [read_frame(f)[0].assign(target=read_frame(f)[1]["target"]) for f in job.input.lm_plain],
                ignore_index=True,
            ),
        )
    report = build_report(frame, history, drafts, dict(p.items()), lm=lm)
    publish_job(job, report)
    job.note(seeds=p.seeds)
