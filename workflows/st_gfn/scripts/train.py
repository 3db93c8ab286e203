import pandas as pd
import torch

from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.game_training import train_game
from paperflow.st_gfn.games import GAME_KINDS
from paperflow.st_gfn.training import NOISE_SEED_OFFSET, train_one

with snakemake_job(snakemake) as job:
    spec, method, train = dict(job.params.spec), dict(job.params.method), dict(job.params.train)
    target, _ = read_frame(job.input.target)
    lightning = train["engine"] == "lightning"
    if lightning:  # paper scale; Lightning's import alone costs seconds that smoke-scale jobs cannot spare
        from paperflow.st_gfn.lightning import fit_one
    states, histories, visits, tracking = {}, [], [], {}
    for seed in job.params.seeds:  # seeds in one job: process start would dominate runs of seconds
        if lightning:
            states[f"seed{seed}"], history, visited, tracking[f"seed{seed}"] = fit_one(
                spec,
                target,
                method,
                job.params.model,
                train,
                seed,
                run_dir=job.params.run_dir,
                name=f"{job.wildcards.env}-{job.wildcards.method}-seed{seed}",
                wandb=job.params.wandb,
                tags={"paper": "st_gfn", "rule": job.rule, "env": job.wildcards.env, "method": job.wildcards.method},
                # this seed's folder: a rerun loads its results, or resumes its fit (saved every 30 min, mid-epoch)
                checkpoint_dir=job.checkpoint_dir() / f"seed{seed}",
            )
        elif spec["kind"] in GAME_KINDS:
            states[f"seed{seed}"], history, visited = train_game(spec, target, method, job.params.model, train, seed)
        else:
            states[f"seed{seed}"], history, visited = train_one(
                make_env(spec, target), spec, method, job.params.model, train, seed
            )
        histories.append(history)
        visits.append(visited)
    torch.save(states, job.output.model)
    write_frame(
        job.output.history,
        pd.concat(histories, ignore_index=True),
        {"env": job.wildcards.env, "method": job.wildcards.method},
    )
    write_frame(
        job.output.visits,
        pd.concat(visits, ignore_index=True),
        {"env": job.wildcards.env, "method": job.wildcards.method},
    )
    job.note(seeds=job.params.seeds, noise_seed_offset=NOISE_SEED_OFFSET, engine=train["engine"], tracking=tracking)
