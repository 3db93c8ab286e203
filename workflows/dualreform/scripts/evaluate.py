from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.dualreform.stages import evaluate

with snakemake_job(snakemake) as job:
    method = job.wildcards.method
    ckpts = job.keyed("ckpt", types=(int, int)) if method != "raw" else {}
    frame = evaluate(method, job.input.table, job.input.passages, ckpts, job.params.seeds, job.params.settings)
    write_frame(job.output[0], frame, {"method": method})
    job.note(seeds=job.params.seeds, mrr=frame.groupby("iteration")["mrr"].mean().to_dict())
