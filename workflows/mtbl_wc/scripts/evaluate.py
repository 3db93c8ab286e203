import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.mtbl_wc.arrays import load_npz
from paperflow.mtbl_wc.experiment import evaluate

with snakemake_job(snakemake) as job:
    insts = {seed: load_npz(path) for seed, path in job.keyed("instance", types=(int,)).items()}
    runs = {key: load_npz(path) for key, path in job.keyed("run", types=(str, int)).items()}
    histories = job.keyed("history", types=(str, int)).values()
    curves = pd.concat([read_frame(path)[0] for path in histories], ignore_index=True)
    metrics = evaluate(job.params.kind, insts, runs, curves, job.params.output, job.params.checkpoints)
    write_frame(job.output.metrics, metrics, {"problem": job.wildcards.problem})
    write_frame(job.output.curves, curves, {"problem": job.wildcards.problem})
    job.note(seeds=sorted(insts))
