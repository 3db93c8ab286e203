import pandas as pd
from safetensors.torch import save_file

from paperflow.confu.problems import examples, world_of
from paperflow.confu.stages import greedy_exact, references, regenerate, target_spec, train_target
from paperflow.core.job import snakemake_job
from paperflow.core.lm.models import save_checkpoint

with snakemake_job(snakemake) as job:
    p = job.params
    seed = int(p.target["seed"])
    cfg = {"data": p.data, "target": p.target, "decoding": p.references}
    problems = pd.read_parquet(job.input.problems)
    model, rows = train_target(problems, cfg, seed)
    save_checkpoint(model, job.output.checkpoint, target_spec(cfg, model.config.vocab_size))
    test = problems[problems.split == "test"].reset_index(drop=True)
    exact = greedy_exact(model, test, cfg)
    history = pd.DataFrame(rows).assign(seed=seed)
    for task, acc in exact.items():
        history[f"exact_{task}"] = acc
    history.to_csv(job.output.history, index=False)
    train = examples(problems[problems.split == "train"])
    n = int(p.n_prompts)
    per_task = [ex for name in world_of(p.data).tasks for ex in [e for e in train if e.task == name][: n // 2]]
    data = regenerate(model, per_task, cfg)
    save_file({k: v.contiguous() for k, v in data.items()}, job.output.data)
    references(model, test, cfg, p.seeds).to_parquet(job.output.references, index=False)
    job.note(seeds=[seed], greedy_exact_match=exact.to_dict(), final_loss=float(rows[-1]["loss"]))
