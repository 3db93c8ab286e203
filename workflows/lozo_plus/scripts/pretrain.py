from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.stages import pretrain

with snakemake_job(snakemake) as job:
    p = job.params
    history = pretrain(p.model, p.pretrain, job.input.source_test, job.input.test, job.output.checkpoint)
    history.to_csv(job.output.history, index=False)
    last = history.iloc[-1]
    job.note(
        seeds=[p.pretrain["seed"]],
        source_accuracy=float(last["source_test_accuracy"]),
        target_accuracy=float(last["target_test_accuracy"]),
    )
