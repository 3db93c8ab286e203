from paperflow.annealed_langevin.sampler import build_grid
from paperflow.annealed_langevin.targets import read_target
from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    gmm, _ = read_target(job.input[0])
    grid = build_grid(
        job.wildcards.path,
        gmm,
        float(job.wildcards.T),
        job.params.tau0,
        job.params.t_max,
        job.params.maxit,
        job.params.grid,
    )
    write_frame(job.output[0], grid, {"path": job.wildcards.path, "T": job.wildcards.T})
    job.note(iterations=len(grid) - 1, t_end=float(grid.t.iloc[-1]))
