import json

from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.credal_dro.evaluation import evaluate
from paperflow.credal_dro.tables import load_splits

with snakemake_job(snakemake) as job:
    models = {method: json.loads(open(path).read()) for method, path in job.keyed("model").items()}
    frame = evaluate(
        job.wildcards.exp,
        models,
        load_splits(job.input.splits),
        json.loads(open(job.input.bulks).read()),
        dict(job.params.cfg),
    )
    write_frame(job.output[0], frame, {"experiment": job.wildcards.exp})
    job.note(seeds=sorted({int(s) for s in frame.seed.unique()}))
