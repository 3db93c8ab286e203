import json

from paperflow.core.job import snakemake_job
from paperflow.credal_dro.heads import train_text
from paperflow.credal_dro.tables import load_splits

with snakemake_job(snakemake) as job:
    doc = train_text(
        job.wildcards.method,
        load_splits(job.input.splits),
        json.loads(open(job.input.bulks).read()),
        dict(job.params.cfg),
        job.params.seeds,
        job.params.run_dir,
        job.params.wandb,
        {"paper": "credal_dro", "rule": job.rule, "method": job.wildcards.method},
        journal=job.checkpoint_dir() / "fits.jsonl",  # finished (seed, grid value) fits; a rerun fits only the rest
    )
    open(job.output[0], "w").write(json.dumps(doc, indent=1))
    job.note(seeds=job.params.seeds, engine=job.params.cfg["train"]["engine"])
