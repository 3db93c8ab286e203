from paperflow.core.job import snakemake_job
from paperflow.dualreform.stages import preprocess

with snakemake_job(snakemake) as job:
    p = job.params
    table = preprocess(job.input.passages, job.input.turns, p.bm25, p.teacher_seed, p.tiebreak_seed, job.output[0])
    job.note(seeds=[p.teacher_seed, p.tiebreak_seed], n_turns=len(table))
