from paperflow.core.job import snakemake_job
from paperflow.promptscale.stages import train_seed

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    curves = train_seed(
        job.input.problems,
        job.input.triples,
        job.input.vocabulary,
        job.params.settings,
        seed,
        job.params.variants,
        dict(job.output.items()),
    )
    curves.to_csv(job.output.curves, index=False)
    last = curves[curves["iteration"] == curves["iteration"].max()]
    job.note(seeds=[seed], final=last.set_index("variant")[["iwae", "recovery"]].to_dict("index"))
