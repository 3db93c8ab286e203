from paperflow.confu.paper_train import launch, train_spec
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    w, p, i, o = job.wildcards, job.params, job.input, job.output
    cfg = {"draft": p.draft, "confu": p.confu, "regenerate": p.regenerate}
    init = i.init if "init" in i.keys() else None
    checkpoints = str(job.checkpoint_dir())  # each rank's loop state, saved every 30 min; a rerun resumes there
    spec = train_spec(
        w.method, w.target, p.target, cfg, i.pretrained, list(i.data), init, o.head, o.history, p.seeds[0], checkpoints
    )
    command = launch(spec, o.spec, p.processes)
    job.note(seeds=p.seeds[:1], command=command)
