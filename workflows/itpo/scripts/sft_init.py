from paperflow.core.job import snakemake_job
from paperflow.itpo.stages import sft_init

with snakemake_job(snakemake) as job:
    p = job.params
    history = sft_init(job.input.vocabulary, job.input.eval_tasks, p.model, p.sft, job.output.checkpoint)
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[p.sft["seed"]], greedy_success=float(history["greedy_success"].dropna().iloc[-1]))
