from pathlib import Path

from paperflow.core.job import snakemake_job
from paperflow.core.summary import summary_markdown

with snakemake_job(snakemake) as job:
    Path(job.output[0]).write_text(summary_markdown(job.input, job.params.scale))
