import pandas as pd
from safetensors.torch import load_file

from paperflow.confu.model import save_head
from paperflow.confu.problems import world_of
from paperflow.confu.training import train_draft, unpadded
from paperflow.core.job import snakemake_job
from paperflow.core.lm.models import load_checkpoint

with snakemake_job(snakemake) as job:
    p = job.params
    method = job.wildcards.method
    cfg = {"data": p.data, "target": p.target, "draft": p.draft, "confu": p.confu}
    target, data = load_checkpoint(job.input.target), load_file(job.input.data)
    # the padded set as (ids, prompt length) per sequence; each batch is padded again to its own width
    seqs, width = unpadded(data), int(data["input_ids"].shape[1])
    pad = world_of(p.data).tokenizer().pad_token_id
    inits = job.keyed("init", (int,)) if any(k.startswith("init__") for k in job.input.keys()) else {}
    histories = []
    for seed, out in zip(p.seeds, job.output.checkpoints):
        head, rows = train_draft(method, target, seqs, cfg, seed, init=inits.get(seed), pad=pad, max_length=width)
        save_head(head, out, {"seed": seed, "method": method})
        histories.append(pd.DataFrame(rows).assign(seed=seed, method=method))
    history = pd.concat(histories, ignore_index=True)
    history.to_csv(job.output.history, index=False)
    last = history.groupby("seed").last()
    job.note(seeds=p.seeds, final_loss={int(s): float(v) for s, v in last["loss"].items()})
