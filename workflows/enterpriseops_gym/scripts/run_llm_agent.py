import json

from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.llm import run_llm
from paperflow.enterpriseops_gym.settings import llm_modes
from paperflow.enterpriseops_gym.stages import write_jsonl

with snakemake_job(snakemake) as job:
    plan = job.wildcards.plan
    tasks = dict(zip(llm_modes(job.params.llm, plan), job.input.tasks, strict=True))
    records, notes = run_llm(plan, job.input.model, job.input.sql, tasks, job.params.llm, job.threads)
    write_jsonl(job.output.runs, records)
    with open(job.output.notes, "w") as fh:
        json.dump({"agent": f"llm_{plan}", "episodes": len(records), **notes}, fh, indent=2)
    job.note(seeds=[0], episodes=len(records), successes=sum(r["overall_success"] for r in records))
