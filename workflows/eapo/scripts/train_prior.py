from paperflow.core.job import snakemake_job
from paperflow.eapo.stages import train_prior

with snakemake_job(snakemake) as job:
    p = job.params
    curves = train_prior(p.task, job.input.problems, job.input.base, p.settings, job.output.checkpoint)
    curves.to_csv(job.output.curves, index=False)
    job.note(
        seeds=[p.settings["prior"]["seed"]],
        steps=int(curves["step"].max()),
        greedy_validation_accuracy=float(curves["validation_accuracy"].dropna().iloc[-1]),
        greedy_test_accuracy=float(curves["test_accuracy"].dropna().iloc[-1]),
    )
