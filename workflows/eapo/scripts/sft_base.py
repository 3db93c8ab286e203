from paperflow.core.job import snakemake_job
from paperflow.eapo.stages import train_base

with snakemake_job(snakemake) as job:
    p = job.params
    history = train_base(p.task, job.input.problems, job.input.vocabulary, p.model, p.sft, job.output.checkpoint)
    history.to_csv(job.output.history, index=False)
    final = history["test_accuracy"].dropna().iloc[-1]
    job.note(seeds=[p.sft["seed"]], greedy_test_accuracy=float(final), steps=int(p.sft["steps"]))
