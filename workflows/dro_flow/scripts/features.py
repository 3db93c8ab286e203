from paperflow.core.job import snakemake_job
from paperflow.dro_flow.features import write_features

with snakemake_job(snakemake) as job:
    spec = dict(job.params.spec)
    device = write_features(
        job.input.images,
        spec["images_sha256"],
        job.input.weights,
        spec["head_seed"],
        spec["batch_size"],
        job.output.train,
        job.output.test,
    )
    job.note(seeds=[spec["head_seed"]], device=device)
