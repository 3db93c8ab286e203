from paperflow.core.job import snakemake_job
from paperflow.dualreform.prepare import download

with snakemake_job(snakemake) as job:
    p = job.params
    world = download(p.source, p.world, p.world_seed, job.output.passages, job.output.turns)
    job.note(seeds=[p.world_seed], n_passages=len(world.passages), n_turns=len(world.turns))
