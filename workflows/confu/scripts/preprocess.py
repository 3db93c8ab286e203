import json

import pandas as pd

from paperflow.confu.problems import world_of
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    p = job.params
    frame = pd.read_parquet(job.input[0])
    tok = world_of(p.data).tokenizer()
    vocab = tok.get_vocab()
    words = {w for col in ("prompt", "answer") for text in frame[col] for w in text.split()}
    unknown = sorted(words - set(vocab))
    if unknown:
        raise ValueError(f"problem words outside the tokenizer's vocabulary: {unknown}")
    longest = int((frame.prompt.str.split().str.len() + frame.answer.str.split().str.len()).max()) + 2
    with open(job.output[0], "w") as fh:
        json.dump({"tokens": sorted(vocab, key=vocab.get), "longest_sequence": longest}, fh, indent=1)
    job.note(vocab_size=len(vocab), longest_sequence=longest)
