from paperflow.core.job import snakemake_job
from paperflow.itpo.stages import train_method

with snakemake_job(snakemake) as job:
    p = job.params
    curves = train_method(
        job.wildcards.method, job.input.init, job.input.eval_tasks, p.rl, p.seeds, job.output.checkpoints
    )
    curves.to_csv(job.output.curves, index=False)
    final = curves.dropna(subset=["greedy_success"]).groupby("seed")["greedy_success"].last()
    job.note(seeds=list(p.seeds), final_greedy_success={int(k): float(v) for k, v in final.items()})
