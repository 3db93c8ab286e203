import re

from paperflow.core.job import snakemake_job
from paperflow.eapo.stages import train_method


def of_method(files, method):
    """The paths among a rule's output `files` (one path or a list) that belong to `method`'s folder."""
    return [f for f in ([files] if isinstance(files, str) else list(files)) if f"/{method}/" in f]


with snakemake_job(snakemake) as job:
    p = job.params
    methods = p.methods if hasattr(p, "methods") else [job.wildcards.method]
    prior = job.input.prior if "prior" in job.input.keys() else None
    finals = {}
    for method in methods:
        outputs = {
            int(re.search(r"seed(\d+)\.safetensors$", f).group(1)): f for f in of_method(job.output.checkpoints, method)
        }
        curves, mechanism = train_method(
            method, p.task, job.input.problems, job.input.base, prior, p.settings, p.seeds, outputs
        )
        curves.to_csv(of_method(job.output.curves, method)[0], index=False)
        mechanism.to_csv(of_method(job.output.mechanism, method)[0], index=False)
        finals[method] = {int(k): float(v) for k, v in curves.groupby("seed")["test_accuracy"].last().items()}
    job.note(seeds=p.seeds, final_greedy_accuracy=finals)
