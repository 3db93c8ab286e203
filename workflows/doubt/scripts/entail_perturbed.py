from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.vl_uncertainty import entail

with snakemake_job(snakemake) as job:
    journal = job.checkpoint_dir() / "rows.jsonl"
    frame = entail(job.input.nli, job.params.spec, job.input.questions, job.input.perturbed, journal=journal)
    write_frame(job.output[0], frame, {"nli": job.params.spec["hub"]})
    job.note(items=len(frame))
