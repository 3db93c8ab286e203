import json
from pathlib import Path

from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import launch, model_folder, train_spec

with snakemake_job(snakemake) as job:
    p, i, o = job.params, job.input, job.output
    folder = str(Path(o.model).with_suffix(""))
    prior = model_folder(i.prior) if "prior" in i.keys() else None
    start = model_folder(i.start)
    checkpoints = str(job.checkpoint_dir())  # TRL saves there every 30 min and a rerun resumes (paper_train.run)
    spec = train_spec(
        p.settings,
        p.method,
        p.seed,
        start,
        prior,
        i.train,
        folder,
        o.history,
        o.rollouts,
        p.processes,
        p.steps,
        checkpoints=checkpoints,
    )
    launch(spec, folder + ".spec.json", p.processes)
    Path(o.model).write_text(json.dumps({"folder": folder, "method": p.method, "seed": p.seed}, indent=1) + "\n")
    job.note(seeds=[p.seed], method=p.method, processes=p.processes)
