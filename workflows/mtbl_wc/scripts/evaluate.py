import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.mtbl_wc.arrays import load_npz
from paperflow.mtbl_wc.experiment import evaluate

with snakemake_job(snakemake) as job:
    seeds, methods = list(job.params.seeds), list(job.params.methods)
    insts = {s: load_npz(p) for s, p in zip(seeds, job.input.instances)}
    keys = [(m, s) for m in methods for s in seeds]  # method-major, seed-minor: the rule's input order
    runs = {k: load_npz(p) for k, p in zip(keys, job.input.runs)}
    curves = pd.concat([read_frame(p)[0] for p in job.input.histories], ignore_index=True)
    metrics = evaluate(job.params.kind, insts, runs, curves, job.params.output, list(job.params.checkpoints))
    write_frame(job.output.metrics, metrics, {"problem": job.wildcards.problem})
    write_frame(job.output.curves, curves, {"problem": job.wildcards.problem})
    job.note(seeds=seeds)
