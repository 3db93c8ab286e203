import json

from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.runs import run_agent
from paperflow.enterpriseops_gym.stages import write_jsonl

with snakemake_job(snakemake) as job:
    agent = job.wildcards.agent
    records, notes = run_agent(agent, job.input.sql, job.keyed("tasks"), job.params.settings)
    write_jsonl(job.output.runs, records)
    with open(job.output.notes, "w") as fh:
        json.dump({"agent": agent, "episodes": len(records), **notes}, fh, indent=2)
    seeds = job.params.settings["random"]["seeds"] if agent == "random" else [0]
    job.note(seeds=seeds, episodes=len(records), successes=sum(r["overall_success"] for r in records))
