import pandas as pd

from paperflow.core.io import read_array
from paperflow.core.job import snakemake_job
from paperflow.ph_vae.training import fit

with snakemake_job(snakemake) as job:
    x, _ = read_array(job.input.train)
    histories, tracking = [], {}
    for seed, ckpt in zip(job.params.seeds, job.output.checkpoints):
        history, tracking[f"seed{seed}"] = fit(
            x,
            decoder=job.wildcards.decoder,
            seed=seed,
            model=job.params.model,
            train=job.params.train,
            run_dir=job.params.run_dir,
            checkpoint=ckpt,
            wandb=job.params.wandb,
            tags={"paper": "ph_vae", "rule": job.rule, "dataset": job.wildcards.dataset},
            resume_dir=job.checkpoint_dir() / f"seed{seed}",  # a rerun resumes this seed's fit or loads it
        )
        histories.append(history)
    pd.concat(histories).to_csv(job.output.history, index=False)
    job.note(seeds=job.params.seeds, tracking=tracking)
