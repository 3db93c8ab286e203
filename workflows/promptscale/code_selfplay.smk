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
PROMPTSCALE_SP_SOURCE = PROMPTSCALE["selfplay"]["source"]

# declared only with code among the seed domains, where the config check guarantees models.tester and code_selfplay
if PROMPTSCALE_CODE_SELFPLAY:
    PROMPTSCALE_CODE_SP = PROMPTSCALE["code_selfplay"]

    paper_stages(
        "promptscale",
        PROMPTSCALE,
        promptscale_path,
        stage(
            "code_tests",
            script="code_tests.py",
            env="lm-serve",
            resources=heavy_resources(
                "infer_gpu",
                PROMPTSCALE,
                stage="sample",
                gpus=int(PROMPTSCALE_CODE_SP["tester_gpus"]),
            ),
            input={
                "tester": promptscale_path("models", "tester.json"),
                "synth": promptscale_path("synth", f"{PROMPTSCALE_SP_SOURCE}.jsonl"),
            },
            output={
                "tests": promptscale_path("code_selfplay", "tests.jsonl"),
                "summary": promptscale_path("code_selfplay", "tests.json"),
            },
            log="code_selfplay/tests.log",
            benchmark=True,
            threads=4,
            reads=["vllm"],
            params={"settings": PROMPTSCALE_CODE_SP, "dtype": PROMPTSCALE["models"]["tester"]["dtype"]},
        ),
        stage(
            "code_rollouts",
            script="code_rollouts.py",
            env="lm-serve",
            resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
            input={
                "policy": promptscale_path("models", "policy.json"),
                "tests": promptscale_path("code_selfplay", "tests.jsonl"),
            },
            output={
                "rollouts": promptscale_path("code_selfplay", "rollouts.jsonl"),
                "summary": promptscale_path("code_selfplay", "rollouts.json"),
            },
            log="code_selfplay/rollouts.log",
            benchmark=True,
            threads=4,
            reads=["selfplay", "vllm"],
            params={"dtype": PROMPTSCALE["models"]["policy"]["dtype"]},
        ),
        stage(
            "code_verify",
            script="code_verify.py",
            env="lm",
            resources=resources_of("cpu_medium", runtime=720, mem_mb=32000),
            input={
                "tests": promptscale_path("code_selfplay", "tests.jsonl"),
                "rollouts": promptscale_path("code_selfplay", "rollouts.jsonl"),
            },
            output={
                "verified": promptscale_path("code_selfplay", "verified.jsonl"),
                "summary": promptscale_path("code_selfplay", "verify.json"),
            },
            log="code_selfplay/verify.log",
            threads=16,  # programs run at once (PromptCoT 2.0's self_play_eval.py --num_workers 16)
            params={"limits": PROMPTSCALE["code_eval"]},
        ),
        stage(
            "code_pairs",
            script="code_pairs.py",
            env="lm",
            resources=resources_of("cpu_light"),
            input=promptscale_path("code_selfplay", "verified.jsonl"),
            output={
                "pairs": promptscale_path("code_selfplay", "pairs.jsonl"),
                "summary": promptscale_path("code_selfplay", "pairs.json"),
            },
            log="code_selfplay/pairs.log",
            reads=["selfplay"],
        ),
    )
