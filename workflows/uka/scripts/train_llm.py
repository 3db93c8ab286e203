from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.uka.paper import backbone, train

with snakemake_job(snakemake) as job:
    i, p, method = job.input, job.params, job.wildcards.method
    journal = job.checkpoint_dir() / "turns.jsonl"  # the finished turns: a rerun asks only the rest
    with backbone(i.pretrained, p.settings, job.log[0] + ".server") as client:
        memory, attempts = train(client, method, i.cases, i.embeddings, i.tom, p.settings, p.seeds, journal)
    write_frame(job.output.memory, memory, {"method": method})
    attempts.to_csv(job.output.attempts, index=False)
    job.note(seeds=p.seeds, entries=memory.groupby("seed").size().to_dict())
