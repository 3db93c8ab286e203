import json

from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import run_model, write_jsonl

with snakemake_job(snakemake) as job:
    model = job.wildcards.model
    model_json = job.input.model if "model" in job.input.keys() else None
    records, notes = run_model(
        model,
        job.params.model,
        job.keyed("tasks"),
        job.params.official,
        model_json,
        job.params.server_log,
        job.params.servers_log_dir,
        journal=job.checkpoint_dir() / "episodes.jsonl",  # finished episodes; a rerun runs only the rest
    )
    write_jsonl(job.output.runs, records)
    with open(job.output.notes, "w") as fh:
        json.dump({"episodes": len(records), **notes}, fh, indent=2)
    job.note(
        episodes=len(records),
        errored=sum(r["errored"] is not None for r in records),
        successes=sum(r["overall_success"] for r in records),
    )
