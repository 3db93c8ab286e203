# promptscale at paper scale, included by paper.smk: code self-play, unit tests generated for p_E's code problems,
# the policy's programs run against them in the sandbox, chosen/rejected pairs (spec 2.5).
# With `code` in `seeds_data.domains` (PROMPTSCALE_CODE_SELFPLAY, paper.smk): the tester (models.tester, Qwen3-32B,
# vLLM tensor parallel over code_selfplay.tester_gpus) writes tests for the synthesised code problems of
# `selfplay.source` in `code_selfplay.rounds` rounds; the policy's rollouts on the problems that keep
# `code_selfplay.min_tests` tests (the math self-play's sampling: selfplay.seeds x completions_per_seed at
# selfplay.temperature); their programs run in the sandbox (code_eval limits); chosen/rejected pairs, which
# promptscale_dpo (paper.smk) trains on with the math pairs. Without code, no job of this file is in the DAG.
# (paperflow.promptscale.code_selfplay)
# (The code_selfplay block is checked when the config loads: promptscale.settings.check_paper.)
PROMPTSCALE_CODE_SP = PROMPTSCALE.get("code_selfplay", {})  # used only when code is a domain
PROMPTSCALE_SP_SOURCE = PROMPTSCALE["selfplay"]["source"]


rule promptscale_code_tests:
    input:
        tester=promptscale_path("models", "tester.json"),
        synth=promptscale_path("synth", f"{PROMPTSCALE_SP_SOURCE}.jsonl"),
    output:
        tests=promptscale_path("code_selfplay", "tests.jsonl"),
        summary=promptscale_path("code_selfplay", "tests.json"),
    log:
        promptscale_path("logs", "code_selfplay", "tests.log"),
    benchmark:
        promptscale_path("benchmarks", "code_tests.tsv")
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources(
            "infer_gpu",
            PROMPTSCALE,
            stage="sample",
            gpus=int(PROMPTSCALE_CODE_SP.get("tester_gpus", 1)),
        ),
    params:
        settings=PROMPTSCALE_CODE_SP,
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE["models"].get("tester", {}).get("dtype", "bfloat16"),
        code=code_param("lm-serve", "workflows/promptscale/scripts/code_tests.py"),
    script:
        "scripts/code_tests.py"


rule promptscale_code_rollouts:
    input:
        policy=promptscale_path("models", "policy.json"),
        tests=promptscale_path("code_selfplay", "tests.jsonl"),
    output:
        rollouts=promptscale_path("code_selfplay", "rollouts.jsonl"),
        summary=promptscale_path("code_selfplay", "rollouts.json"),
    log:
        promptscale_path("logs", "code_selfplay", "rollouts.log"),
    benchmark:
        promptscale_path("benchmarks", "code_rollouts.tsv")
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
    params:
        selfplay=PROMPTSCALE["selfplay"],
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE["models"]["policy"]["dtype"],
        code=code_param("lm-serve", "workflows/promptscale/scripts/code_rollouts.py"),
    script:
        "scripts/code_rollouts.py"


rule promptscale_code_verify:
    input:
        tests=promptscale_path("code_selfplay", "tests.jsonl"),
        rollouts=promptscale_path("code_selfplay", "rollouts.jsonl"),
    output:
        verified=promptscale_path("code_selfplay", "verified.jsonl"),
        summary=promptscale_path("code_selfplay", "verify.json"),
    log:
        promptscale_path("logs", "code_selfplay", "verify.log"),
    conda:
        env_file("lm")
    threads: 16  # programs run at once (PromptCoT 2.0's self_play_eval.py --num_workers 16)
    resources:
        **resources_of("cpu_medium", runtime=720, mem_mb=32000),
    params:
        limits=PROMPTSCALE["code_eval"],
        code=code_param("lm", "workflows/promptscale/scripts/code_verify.py"),
    script:
        "scripts/code_verify.py"


rule promptscale_code_pairs:
    input:
        promptscale_path("code_selfplay", "verified.jsonl"),
    output:
        pairs=promptscale_path("code_selfplay", "pairs.jsonl"),
        summary=promptscale_path("code_selfplay", "pairs.json"),
    log:
        promptscale_path("logs", "code_selfplay", "pairs.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        selfplay=PROMPTSCALE["selfplay"],
        code=code_param("lm", "workflows/promptscale/scripts/code_pairs.py"),
    script:
        "scripts/code_pairs.py"
