from paperflow.annealed_langevin.paths import drift
from paperflow.annealed_langevin.sampler import sample_path
from paperflow.annealed_langevin.targets import read_target
from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    gmm, _ = read_target(job.input.target)
    grid, _ = read_frame(job.input.grid)
    d = job.params.drift
    b = drift(
        job.wildcards.path,
        gmm,
        tempering=d["tempering"],
        dilation=d["dilation"],
        score=d["score"],
        prox_iters=job.params.prox_iters,
    )
    snaps = sample_path(
        gmm,
        grid,
        b,
        x0=job.params.x0,
        n_particles=job.params.n_particles,
        seeds=job.params.seeds,
        check_every=job.params.check_every,
        checkpoint_dir=job.checkpoint_dir(),  # each seed's chain, saved every 30 min; a rerun continues it
    )
    write_frame(job.output[0], snaps, {"path": job.wildcards.path, "T": job.wildcards.T, "drift": dict(d)})
    job.note(seeds=job.params.seeds, iterations=len(grid) - 1)
