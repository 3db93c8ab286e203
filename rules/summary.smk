# The cross-paper summary: one table of every claim of every enabled paper, from their metrics.json.


rule summary:
    input:
        [RUN.out(slug, "metrics.json") for slug in RUN.papers],
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
