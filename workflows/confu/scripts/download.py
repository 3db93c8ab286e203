from paperflow.confu.problems import make_problems
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    p = job.params
    if p.source["kind"] != "synthetic":
        raise NotImplementedError("paper scale (ShareGPT/UltraChat + Spec-Bench) is not wired yet; see the README")
    frame = make_problems(p.data)
    frame.to_parquet(job.output[0], index=False)
    job.note(seeds=[p.data["seed"]], n_problems=frame.groupby(["task", "split"]).size().to_dict())
