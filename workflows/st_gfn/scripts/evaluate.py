from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.evaluation import EVAL_SEED_OFFSET, evaluate_env

with snakemake_job(snakemake) as job:
    methods, seeds, spec = list(job.params.methods), list(job.params.seeds), dict(job.params.spec)
    target, _ = read_frame(job.input.target)
    per_method = {
        m: (ckpt, read_frame(v)[0], read_frame(h)[0])
        for m, ckpt, v, h in zip(methods, job.input.models, job.input.visits, job.input.histories)
    }
    runs = (
        (m, s, per_method[m][0], per_method[m][1].query("seed == @s"), per_method[m][2].query("seed == @s"))
        for m in methods
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
