from paperflow.core.job import snakemake_job
from paperflow.dualreform.stages import preprocess

with snakemake_job(snakemake) as job:
    p = job.params
    table = preprocess(
        job.input.passages,
        job.input.turns,
        p.bm25,
        p.teacher_seed,
        p.teacher_error_rate,
        p.tiebreak_seed,
        job.output[0],
    )
    train = table[table["split"] == "train"]
    job.note(
        seeds=[p.teacher_seed, p.tiebreak_seed],
        n_turns=len(table),
        teacher_rewrite_error=float((train["teacher_rewrite_error"] != "").mean()),
        teacher_refine_error=float((train["teacher_refine_error"] != "").mean()),
    )
