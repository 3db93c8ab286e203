from pathlib import Path

from paperflow.core.job import snakemake_job
from paperflow.promptscale.codeforces import download_contests
from paperflow.promptscale.paper import download_corpus

with snakemake_job(snakemake) as job:
    p = job.params
    # the problems from the pinned snapshot (no input file: `paperflow pin` runs this job beside the other downloads)
    problems = Path(job.output[0]).with_name("contests.problems.jsonl")
    try:
        download_corpus(p.corpus, p.spec, p.cache, str(problems))
        job.note(**download_contests(str(problems), p.settings, p.cache, job.output[0]))
    finally:
        problems.unlink(missing_ok=True)
