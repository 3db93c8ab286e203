from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.vl_uncertainty import entail

with snakemake_job(snakemake) as job:
    frame = entail(job.input.nli, job.params.spec, job.input.questions, job.input.perturbed)
    write_frame(job.output[0], frame, {"nli": job.params.spec["hub"]})
    job.note(items=len(frame))
