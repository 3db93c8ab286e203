import numpy as np

from paperflow.core.job import snakemake_job
from paperflow.specflow.stages import make_scenes

with snakemake_job(snakemake) as job:
    p = job.params
    if p.source["kind"] != "synthetic":
        raise NotImplementedError("paper scale (LLaVA-1.5 + benchmarks) is not wired yet; see the README")
    scenes = make_scenes(p.data)
    np.savez_compressed(job.output[0], **scenes)
    job.note(seeds=[p.data["count"]["seed"], p.data["control"]["seed"]], n_scenes=len(scenes["count"]))
