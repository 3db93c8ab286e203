import numpy as np

from paperflow.core.io import read_array, write_frame
from paperflow.core.job import snakemake_job
from paperflow.ph_vae.evaluation import SAMPLE_SEED_OFFSET, evaluate

with snakemake_job(snakemake) as job:
    x_test, meta = read_array(job.input.test)
    x_all = np.vstack([read_array(job.input.train)[0], x_test])
    seeds, cfg = job.params.seeds, job.params.evaluate
    metrics, samples = evaluate(
        checkpoints=[(d, s, path) for (d, s), path in job.keyed("ckpt", types=(str, int)).items()],
        x_test=x_test,
        x_all=x_all,
        truth=meta["truth"],
        n_samples=cfg["n_samples"],
        tail_q=cfg["tail_q"],
        min_tail=cfg["min_tail"],
    )
    write_frame(job.output.metrics, metrics, {"dataset": job.wildcards.dataset, "truth": meta["truth"]})
    write_frame(job.output.samples, samples, {"dataset": job.wildcards.dataset})
    job.note(seeds=seeds, sample_seed_offset=SAMPLE_SEED_OFFSET)
