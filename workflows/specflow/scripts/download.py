import numpy as np

from paperflow.core.job import snakemake_job
from paperflow.specflow.stages import make_scenes

with snakemake_job(snakemake) as job:
    p = job.params
    if p.source["kind"] != "synthetic":
        raise ValueError(f"source.kind {p.source['kind']!r}: the scenes download is the synthetic source's")
    scenes = make_scenes(p.data)
    np.savez_compressed(job.output[0], **scenes)
    job.note(seeds=[p.data["count"]["seed"], p.data["control"]["seed"]], n_scenes=len(scenes["count"]))
