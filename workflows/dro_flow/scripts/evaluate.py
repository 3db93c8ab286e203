from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.dro_flow.evaluation import ATTACK_SEED_OFFSET, evaluate
from paperflow.dro_flow.problems import make_problem

with snakemake_job(snakemake) as job:
    train, meta = read_frame(job.input.train)
    test, _ = read_frame(job.input.test)
    problem = make_problem(train, meta, dict(job.params.model))
    frame = evaluate(problem, test, list(job.keyed("ckpt").items()), dict(job.params.evaluate))
    write_frame(job.output[0], frame, {"dataset": job.wildcards.dataset})
    job.note(seeds=sorted(set(frame.seed.tolist())), attack_seed_offset=ATTACK_SEED_OFFSET)
