# paperflow: one Snakemake DAG per paper, composed here.
#   snakemake --cores 2                                   # every enabled paper at smoke scale
#   snakemake --cores 2 --config scale=tiny papers=[ph_vae]
#   snakemake --profile profiles/slurm --config scale=paper
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"


for _slug in RUN.papers:

    include: f"workflows/{_slug}/Snakefile"


include: "rules/summary.smk"
include: "rules/stages.smk"


rule all:
    default_target: True
    input:
        RUN.out_root("summary.md"),
        [RUN.out(slug, "report.md") for slug in RUN.papers],
