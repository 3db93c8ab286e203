import json

from paperflow.core.job import snakemake_job
from paperflow.credal_dro.fitting import CENTRAL_SEED_OFFSET, train_convex
from paperflow.credal_dro.tables import load_splits

with snakemake_job(snakemake) as job:
    doc = train_convex(
        job.wildcards.exp,
        job.wildcards.method,
        load_splits(job.input.splits),
        json.loads(open(job.input.bulks).read()),
        dict(job.params.cfg),
        dict(job.params.solver),
        job.params.seeds,
        journal=job.checkpoint_dir() / "seeds.jsonl",  # finished seeds; a rerun fits only the rest
    )
    open(job.output[0], "w").write(json.dumps(doc, indent=1))
    job.note(seeds=job.params.seeds, central_seed_offset=CENTRAL_SEED_OFFSET)
