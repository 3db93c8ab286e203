# The cross-paper summary of a scale: one table of every claim of every paper with results at that scale (the
# enabled papers' metrics.json and any other paper's already there), so a run narrowed to some papers rewrites the
# same summary that a plain run after it wants, from the same set of inputs.
from paperflow.core.config import summarised_papers


rule summary:
    input:
        [RUN.out(slug, "metrics.json") for slug in summarised_papers(RUN, PAPERFLOW_ROOT)],
    output:
        report(RUN.out_root("summary.md"), category="Summary"),
    log:
        RUN.out_root("logs", "summary.log"),
    conda:
        env_file("base")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        scale=RUN.scale,
        code=code_param("base", "rules/scripts/summary.py"),
    script:
        "scripts/summary.py"
