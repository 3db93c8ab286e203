from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.stages import evaluate

with snakemake_job(snakemake) as job:
    frame = evaluate(job.keyed("models", types=(str, str)), job.input.source, job.input.dev, job.input.test)
    write_frame(job.output[0], frame)
    job.note(
        seeds=sorted({int(s) for s in frame["seed"] if s >= 0}),
        test_accuracy=frame.groupby("method")["test_accuracy"].mean().to_dict(),
    )
