from paperflow.core.job import snakemake_job
from paperflow.promptscale.stages import run_solver

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    p = job.params
    cfg = {"model": p.model, "synthesis": p.synthesis, "solver": p.solver}
    accuracy, dpo = run_solver(job.input.problems, job.input.prompt_model, job.input.vocabulary, cfg, seed)
    accuracy.to_csv(job.output.accuracy, index=False)
    dpo.to_csv(job.output.dpo, index=False)
    job.note(seeds=[seed], test_accuracy=accuracy.set_index("arm")["test_accuracy"].to_dict())
