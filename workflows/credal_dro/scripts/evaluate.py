import json

from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.credal_dro.evaluation import evaluate
from paperflow.credal_dro.tables import load_splits

with snakemake_job(snakemake) as job:
    models = {m: json.loads(open(p).read()) for m, p in zip(job.params.methods, job.input.models)}
    frame = evaluate(
        job.wildcards.exp,
        models,
        load_splits(job.input.splits),
        json.loads(open(job.input.bulks).read()),
        dict(job.params.cfg),
    )
    write_frame(job.output[0], frame, {"experiment": job.wildcards.exp})
    job.note(seeds=sorted({int(s) for s in frame.seed.unique()}))
