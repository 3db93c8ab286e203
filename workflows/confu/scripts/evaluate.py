import pandas as pd

from paperflow.confu.model import load_head
from paperflow.confu.settings import controls_of
from paperflow.confu.stages import evaluate
from paperflow.core.job import snakemake_job
from paperflow.core.lm.models import load_checkpoint

with snakemake_job(snakemake) as job:
    p = job.params
    method = job.wildcards.method
    cfg = {"data": p.data, "target": p.target, "draft": p.draft, "decoding": p.decoding}
    problems = pd.read_parquet(job.input.problems)
    test = problems[problems.split == "test"].reset_index(drop=True)
    target, refs = load_checkpoint(job.input.target), pd.read_parquet(job.input.references)
    heads = job.keyed("head", (int,))
    frames = []
    for seed in p.seeds:
        head = load_head(heads[seed])
        ref = refs[refs.seed == seed].reset_index(drop=True)
        for variant, (controls, temperatures) in controls_of(method).items():
            frame = evaluate(method, target, head, test, ref, cfg, seed, controls, temperatures)
            frames.append(frame.assign(variant=variant))
    frame = pd.concat(frames, ignore_index=True)
    frame.to_parquet(job.output[0], index=False)
    main = frame[frame.variant == method]
    tau = main.groupby("temperature").apply(lambda g: g.new_after_prefill.sum() / g.cycles.sum(), include_groups=False)
    job.note(seeds=p.seeds, tau={float(t): float(v) for t, v in tau.items()}, lossless=float(main.lossless.mean()))
