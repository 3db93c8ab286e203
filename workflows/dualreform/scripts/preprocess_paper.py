from pathlib import Path

from paperflow.core.job import snakemake_job
from paperflow.dualreform.paper import preprocess

with snakemake_job(snakemake) as job:
    table = preprocess(
        job.input.passages,
        job.input.turns,
        job.params.bm25,
        job.threads,
        job.output.table,
        Path(job.output.index).parent,  # the index folder; its marker (the declared output) is written last
        checkpoint=job.checkpoint_dir(),
    )
    job.note(turns=len(table))
