import re

from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.dualreform.stages import train_method

with snakemake_job(snakemake) as job:
    p = job.params
    method = p.method if hasattr(p, "method") else job.wildcards.method
    outputs = {}
    for path in job.output.checkpoints:
        seed, iteration = map(int, re.search(r"seed(\d+)_it(\d+)\.safetensors$", path).groups())
        outputs[(seed, iteration)] = path
    history, refs = train_method(
        method, job.input.table, job.input.passages, job.keyed("sft", types=(int,)), p.settings, p.seeds, outputs
    )
    history.to_csv(job.output.history, index=False)
    write_frame(job.output.refs, refs, {"method": method})
    accuracy = (refs["ref"] == refs["gold"]).groupby(refs["iteration"]).mean()
    job.note(seeds=p.seeds, pseudo_ref_accuracy={int(k): float(v) for k, v in accuracy.items()})
