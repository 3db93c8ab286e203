import pandas as pd
import torch

from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.training import NOISE_SEED_OFFSET, train_one

with snakemake_job(snakemake) as job:
    spec, method = dict(job.params.spec), dict(job.params.method)
    env = make_env(spec)
    states, histories, visits = {}, [], []
    for seed in job.params.seeds:  # seeds in one job: process start would dominate runs of seconds
        states[f"seed{seed}"], history, visited = train_one(env, spec, method, job.params.model, job.params.train, seed)
        histories.append(history)
        visits.append(visited)
    torch.save(states, job.output.model)
    write_frame(job.output.history, pd.concat(histories, ignore_index=True), {"env": job.wildcards.env, "method": job.wildcards.method})
    write_frame(job.output.visits, pd.concat(visits, ignore_index=True), {"env": job.wildcards.env, "method": job.wildcards.method})
    job.note(seeds=job.params.seeds, noise_seed_offset=NOISE_SEED_OFFSET)
