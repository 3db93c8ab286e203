from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.itpo.stages import turn_analysis

with snakemake_job(snakemake) as job:
    p = job.params
    frame = turn_analysis(
        job.keyed("ckpt", types=(str, str)), job.input.init, job.input.analysis_tasks, p.analysis, p.beta
    )
    write_frame(job.output[0], frame, {"analysis": dict(p.analysis)})
    job.note(seeds=sorted(set(frame["seed"])), turns=len(frame))
