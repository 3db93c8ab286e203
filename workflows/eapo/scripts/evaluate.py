from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.eapo.stages import evaluate

with snakemake_job(snakemake) as job:
    p = job.params
    frame = evaluate(job.keyed("ckpt", types=(str, int)), p.task, job.input.problems, p.evaluation)
    write_frame(job.output[0], frame, {"evaluation": dict(p.evaluation)})
    job.note(seeds=sorted(set(frame["seed"])), greedy=frame.groupby("method")["greedy_accuracy"].mean().to_dict())
