import tempfile
from pathlib import Path

from paperflow.core.job import snakemake_job
from paperflow.promptscale.code_selfplay import merge_pairs
from paperflow.promptscale.dpo import dpo_job

with snakemake_job(snakemake) as job:
    p = job.params
    with tempfile.TemporaryDirectory(dir=Path(job.output.history).parent) as tmp:
        pairs = str(Path(tmp) / "pairs.jsonl")  # the math pairs, then the code pairs when code is a domain
        files = job.input.pairs
        counts = merge_pairs([files] if isinstance(files, str) else list(files), pairs)
        checkpoints = str(job.checkpoint_dir())  # TRL saves there every 30 min and a rerun resumes
        summary = dpo_job(
            job.input.policy, pairs, p.dpo, p.device, p.n_procs, job.output.model, job.output.history, checkpoints
        )
    job.note(seeds=[p.dpo["seed"]], **counts, **summary)
