import torch

from paperflow.annealed_langevin.imaging import run_inpainting
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    T = None if job.wildcards.T == "inf" else float(job.wildcards.T)
    summary = run_inpainting(
        job.input.image,
        job.input.weights,
        job.wildcards.path,
        T,
        dict(job.params.imaging),
        device,
        job.output.metrics,
        job.output.figure,
        checkpoint_dir=job.checkpoint_dir(),  # the chain, saved every 30 min; a rerun continues it
    )
    job.note(seeds=[job.params.imaging["mask_seed"]], psnr=summary["psnr_posterior_mean"], device=str(device))
