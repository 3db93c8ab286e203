from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.core.keys import unkey
from paperflow.mtbl_wc.arrays import load_npz, save_npz
from paperflow.mtbl_wc.experiment import train

with snakemake_job(snakemake) as job:
    method, problem = job.wildcards.method, job.wildcards.get("synthetic") or job.wildcards.get("cleaning")
    instances = {seed: load_npz(path) for seed, path in sorted(unkey(job.input, "instance", types=(int,)).items())}
    tags = {"paper": "mtbl_wc", "rule": job.rule, "problem": problem, "method": method}
    results = train(
        job.params.kind,
        method,
        instances,
        dict(job.params.solver),
        job.params.run_dir,
        job.params.wandb,
        tags,
        checkpoint_dir=job.checkpoint_dir(),  # each run's iterates, saved every 30 min; a rerun continues them
    )
    runs, histories = unkey(job.output, "run", types=(int,)), unkey(job.output, "history", types=(int,))
    for seed, result in results.items():
        save_npz(runs[seed], z_best=result.z_best, z_final=result.z_final)
        write_frame(histories[seed], result.history.assign(method=method, seed=seed))
    job.note(seeds=sorted(results))
