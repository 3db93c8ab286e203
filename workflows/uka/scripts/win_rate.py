from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.uka.paper import judge, win_rate

with snakemake_job(snakemake) as job:
    i, p, method = job.input, job.params, job.wildcards.method
    journal = job.checkpoint_dir() / "judged.jsonl"  # the judged pairs: a rerun asks only the rest
    with judge(i.judge, p.settings, job.log[0] + ".server") as client:
        wins = win_rate(client, method, p.reference, i.mine, i.theirs, i.cases, p.settings, p.seeds, journal)
    write_frame(job.output[0], wins)
    job.note(seeds=p.seeds, win_rate=wins.groupby("seed")["win"].mean().to_dict())
