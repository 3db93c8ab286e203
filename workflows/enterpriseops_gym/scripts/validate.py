import json

from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.stages import validate

with snakemake_job(snakemake) as job:
    doc, acceptance, mutants, alternatives = validate(job.input.sql, job.input.tasks, job.params.mutation["seed"])
    with open(job.output.validation, "w") as fh:
        json.dump(doc, fh, indent=2)
    acceptance.to_csv(job.output.acceptance, index=False)
    mutants.to_csv(job.output.mutation, index=False)
    alternatives.to_csv(job.output.alternatives, index=False)
    job.note(seeds=[job.params.mutation["seed"]], sound=doc["sound"], mutants=len(mutants))
