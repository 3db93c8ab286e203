from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.uka.paper import backbone, evaluate, write_transcripts

with snakemake_job(snakemake) as job:
    i, p, method = job.input, job.params, job.wildcards.method
    memory = i.memory if "memory" in i.keys() else None
    journal = job.checkpoint_dir() / "turns.jsonl"  # the finished turns: a rerun asks only the rest
    with backbone(i.pretrained, p.settings, job.log[0] + ".server") as client:
        per_case, per_turn, transcripts = evaluate(
            client, method, i.cases, i.embeddings, i.tom, memory, p.settings, p.seeds, journal
        )
    write_frame(job.output.per_case, per_case)
    write_frame(job.output.per_turn, per_turn)
    write_transcripts(job.output.transcripts, transcripts)
    job.note(seeds=p.seeds, success_rate=per_case.groupby("seed")["success"].mean().to_dict())
