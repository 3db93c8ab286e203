import pandas as pd
import torch

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.dro_flow.problems import make_problem
from paperflow.dro_flow.training import fit

with snakemake_job(snakemake) as job:
    train, meta = read_frame(job.input.train)
    problem = make_problem(train, meta, dict(job.params.model))
    tags = {"paper": "dro_flow", "rule": job.rule, "dataset": job.wildcards.dataset, "method": job.wildcards.method}
    states, histories = {}, []
    for seed in job.params.seeds:
        model, history = fit(
            problem,
            job.wildcards.method,
            dict(job.params.dro),
            dict(job.params.train),
            seed,
            job.params.run_dir,
            job.params.wandb,
            tags,
            checkpoint_dir=job.checkpoint_dir() / f"seed{seed}",  # a rerun continues this seed's fit or loads it
        )
        states[seed] = model.state_dict()
        histories.append(history.assign(dataset=job.wildcards.dataset, method=job.wildcards.method, seed=seed))
    torch.save(states, job.output.checkpoint)
    pd.concat(histories).to_csv(job.output.history, index=False)
    job.note(seeds=job.params.seeds, engine=job.params.train["engine"])
