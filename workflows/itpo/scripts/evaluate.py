from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.itpo.stages import evaluate

with snakemake_job(snakemake) as job:
    frame = evaluate(job.keyed("ckpt", types=(str, str)), job.input.eval_tasks)
    write_frame(job.output[0], frame)
    job.note(seeds=sorted(set(frame["seed"])), greedy=frame.groupby("method")["greedy_success"].mean().to_dict())
