from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt import vl_uncertainty
from paperflow.doubt.paper import score

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    if job.wildcards.method == vl_uncertainty.METHOD:
        frame = vl_uncertainty.score(
            job.input.questions, job.input.perturbed, seed, entail_path=job.input.get("entail")
        )
    else:
        frame = score(
            job.wildcards.method,
            job.input.questions,
            job.input.samples,
            job.input.embeddings,
            job.params.scoring,
            seed,
            entail_path=job.input.get("entail"),
        )
    write_frame(job.output[0], frame, {"scoring": dict(job.params.scoring)})
    job.note(seeds=[seed], rows=len(frame))
