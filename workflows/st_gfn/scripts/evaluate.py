from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.evaluation import EVAL_SEED_OFFSET, evaluate_env

with snakemake_job(snakemake) as job:
    seeds, spec = list(job.params.seeds), dict(job.params.spec)
    target, _ = read_frame(job.input.target)
    models, visits, histories = (job.keyed(name) for name in ("model", "visits", "history"))
    per_method = {m: (ckpt, read_frame(visits[m])[0], read_frame(histories[m])[0]) for m, ckpt in models.items()}
    runs = (
        (m, s, ckpt, visited.query("seed == @s"), history.query("seed == @s"))
        for m, (ckpt, visited, history) in per_method.items()
        for s in seeds
    )
    metrics, pmfs = evaluate_env(
        make_env(spec, target),
        spec,
        target,
        dict(job.params.method_specs),
        runs,
        job.params.model,
        seeds,
        job.params.evaluate,
    )
    write_frame(job.output.metrics, metrics, {"env": job.wildcards.env})
    write_frame(job.output.pmfs, pmfs, {"env": job.wildcards.env})
    job.note(seeds=seeds, eval_seed_offset=EVAL_SEED_OFFSET)
