import re

from paperflow.core.job import snakemake_job
from paperflow.specflow.stages import evaluate_method


def by_seed(files):
    return {int(re.search(r"seed(\d+)\.\w+$", f).group(1)): f for f in files}


with snakemake_job(snakemake) as job:
    p = job.params
    cfg = {"data": p.data, "reader": p.reader, "specflow": p.specflow, "ratios": p.ratios}
    methods = p.methods if hasattr(p, "methods") else [job.wildcards.method]
    relative = {}
    for method, out in zip(methods, job.output):
        frame = evaluate_method(method, cfg, job.input.data, by_seed(job.input.checkpoints), by_seed(job.input.tokens))
        frame.to_csv(out, index=False)
        acc = frame.groupby(["task", "ratio"])[["correct", "full_correct"]].mean()
        relative[method] = {f"{t}@{r}": float(v.correct / v.full_correct) for (t, r), v in acc.iterrows()}
    job.note(seeds=p.seeds, relative=relative)
