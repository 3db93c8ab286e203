import json

import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.enterpriseops_gym.claims import build_report

with snakemake_job(snakemake) as job:
    with open(job.input.validation) as fh:
        validation = json.load(fh)
    notes = {}
    for agent, path in job.keyed("notes").items():
        with open(path) as fh:
            notes[agent] = json.load(fh)
    report = build_report(
        episodes=read_frame(job.input.episodes)[0],
        acceptance=pd.read_csv(job.input.acceptance),
        validation=validation,
        mutants=pd.read_csv(job.input.mutation),
        alternatives=pd.read_csv(job.input.alternatives),
        run_notes=notes,
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=[job.params.world["seed"]])
