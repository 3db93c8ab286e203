# doubt: the functions of its Snakefile (keyed inputs), included first by it; names carry the slug.


def doubt_samples(wildcards):
    """Every seed's sampled answer sets, keyed by seed."""
    return keyed("samples", {s: doubt_path("samples", f"seed{s}.parquet") for s in DOUBT["seeds"]})


def doubt_scores(wildcards):
    """Every detector's scores, keyed by method."""
    return keyed("scores", {m: doubt_path("scores", f"{m}.parquet") for m in DOUBT["methods"]})
