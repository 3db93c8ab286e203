import json

from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.promptscale.paper_report import build_report

with snakemake_job(snakemake) as job:

    def docs(name):
        return [json.loads(open(path).read()) for path in job.keyed(name).values()]

    selfplay = {stage: json.loads(open(path).read()) for stage, path in job.keyed("selfplay").items()}
    codeforces = {policy: json.loads(open(path).read()) for policy, path in job.keyed("codeforces").items()}
    report = build_report(
        docs("bound"), docs("synthesis"), docs("eval"), dict(job.params.items()), selfplay, codeforces
    )
    publish_job(job, report)
