import json

from paperflow.annealed_langevin.claims import build_report
from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job

with snakemake_job(snakemake) as job:
    curves = {key: read_frame(path)[0] for key, path in job.keyed("curve", types=(str, str, str)).items()}
    imaging_files = job.keyed("imaging", types=(str, str)) if job.params.imaging_enabled else {}
    imaging = [json.loads(open(path).read()) for path in imaging_files.values()]
    report = build_report(curves=curves, imaging=imaging, params=dict(job.params.items()), scale=job.scale)
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
