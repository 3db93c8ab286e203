# The factory of the stages' rules (paperflow.core.stages derives their directives), one per declared stage. Each is
# made in a function, not in the loop's body: Snakemake evaluates a `script` directive again when the job runs, so
# a loop variable would give every stage the last stage's script. Two templates, as Snakemake has no empty
# benchmark directive: a stage either writes a benchmark file or has none. (No line here may hold the word "rule"
# and then a colon: `snakemake --lint` reads that as a named rule beside a function.)
from snakemake.io import unpack as _unpack_input


def _stage_rule(_st):
    _inputs = _st["input_args"] + ([_unpack_input(_st["unpack"])] if _st["unpack"] else [])
    if _st["benchmark"]:

        rule:
            name:
                _st["rule"]
            input:
                *_inputs,
                **_st["input"],
            output:
                *_st["output_args"],
                **_st["output"],
            log:
                _st["log"],
            benchmark:
                _st["benchmark"]
            wildcard_constraints:
                **_st["wildcards"],
            priority: _st["priority"]
            conda:
                _st["conda"]
            threads: _st["threads"]
            resources:
                **_st["resources"],
            params:
                **_st["params"],
            script:
                _st["script"]

    else:

        rule:
            name:
                _st["rule"]
            input:
                *_inputs,
                **_st["input"],
            output:
                *_st["output_args"],
                **_st["output"],
            log:
                _st["log"],
            wildcard_constraints:
                **_st["wildcards"],
            priority: _st["priority"]
            conda:
                _st["conda"]
            threads: _st["threads"]
            resources:
                **_st["resources"],
            params:
                **_st["params"],
            script:
                _st["script"]


for _stage in STAGE_TABLES.rules:
    _stage_rule(_stage)
