from paperflow.annealed_langevin.evaluation import FLOOR_SEED_OFFSET, curves
from paperflow.annealed_langevin.targets import read_target
from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    gmm, gt = read_target(job.input.target)
    snaps, _ = read_frame(job.input.samples)
    curve = curves(snaps, gmm, gt, dict(job.params.metric))
    write_frame(
        job.output[0], curve, {"target": job.wildcards.target, "path": job.wildcards.path, "T": job.wildcards.T}
    )
    job.note(seeds=sorted(int(s) for s in curve.seed.unique()), floor_seed_offset=FLOOR_SEED_OFFSET)
