import json

from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import avg_at_k_table, report

with snakemake_job(snakemake) as job:
    p = job.params
    evals = job.keyed("eval", (str, int))
    table = avg_at_k_table(evals, p.benchmarks)
    table.to_csv(job.output.table, index=False)
    metrics = report(table, p.ks, p.pretrained, job.output.report)
    with open(job.output.metrics, "w") as fh:
        json.dump(metrics, fh, indent=2)
    job.note(seeds=sorted({s for _, s in evals}))
