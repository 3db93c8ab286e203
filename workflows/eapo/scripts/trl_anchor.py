import json

from paperflow.core.job import snakemake_job
from paperflow.eapo.stages import trl_anchor

with snakemake_job(snakemake) as job:
    p = job.params
    history, accuracy, settings = trl_anchor(
        p.task, job.input.problems, job.input.base, p.settings, p.anchor, job.output.summary + ".run"
    )
    history.to_csv(job.output.history, index=False)
    summary = {"steps": int(p.anchor["steps"]), "greedy_test_accuracy": accuracy, "settings": settings}
    with open(job.output.summary, "w") as fh:
        json.dump(summary, fh, indent=2)
    job.note(seeds=[p.anchor["seed"]], greedy_test_accuracy=accuracy)
