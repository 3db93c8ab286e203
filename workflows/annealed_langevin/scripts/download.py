from paperflow.annealed_langevin.construct import build_target
from paperflow.annealed_langevin.targets import write_target
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    write_target(job.output[0], build_target(dict(job.params.spec)), job.params.n_gt, job.params.gt_seed)
    job.note(seeds=[job.params.gt_seed])
