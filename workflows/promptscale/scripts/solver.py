from paperflow.core.job import snakemake_job
from paperflow.promptscale.stages import run_solver

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    p = job.params
    cfg = {"model": p.model, "solver": p.solver}
    accuracy, dpo = run_solver(job.input.problems, job.input.synthesised, job.input.vocabulary, cfg, seed, p.selfplay)
    accuracy.to_csv(job.output.accuracy, index=False)
    dpo.to_csv(job.output.dpo, index=False)
    job.note(seeds=[seed], heldout_accuracy=accuracy.set_index("arm")["heldout_accuracy"].to_dict())
