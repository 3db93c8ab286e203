# promptscale at paper scale (source.kind official): the models of `models` and the corpora of `corpora` at pinned
# Hub commits (config, else config/locks/promptscale.json, written by `paperflow pin promptscale`); the training and
# held-out seeds; EM over rationales, iteration m = 0..E: train (TRL SFT of q_m and p_m on one node's GPUs: the cold
# start at m = 0, the kept rationales of E-step m - 1 after), sample (K rationales per seed from q_m, vLLM), score (R
# under p_m, log q_m, best-of-K, the held-out bound); synthesis from p_0 and p_E (vLLM); the policy on the benchmarks
# (vLLM); self-play: the policy's rollouts on p_E's problems (vLLM), majority-vote verification and chosen/rejected
# pairs, TRL DPO of the policy on one node's GPUs; the base and self-play policies on the math benchmarks and on
# LiveCodeBench (code run in a sandbox); the SFT arm: TRL SFT of Qwen2.5-7B-Instruct on PromptCoT 2.0's released
# traces, evaluated as the other policies; report. Every model folder lives beside a small JSON that the rules pass on (the JSON is the output).
from paperflow.core.download import read_lock_revisions

PROMPTSCALE_CACHE = f"{RUN.resources}/promptscale"
PROMPTSCALE_LOCK = read_lock_revisions("promptscale", PAPERFLOW_ROOT)  # a pin changes the params: the download reruns
PROMPTSCALE_E = int(PROMPTSCALE["llm_em"]["iterations"])
PROMPTSCALE_CODE = PROMPTSCALE["code_benchmarks"]  # LiveCodeBench releases, graded in a sandbox
PROMPTSCALE_CORPORA = list(PROMPTSCALE["corpora"])  # every configured corpus has a download job
PROMPTSCALE_DTYPE = PROMPTSCALE["models"]["prompt"]["dtype"]
PROMPTSCALE_SYNTH = {"coldstart": 0, "em": PROMPTSCALE_E}  # prompt model of each synthesis variant: p_0, p_E
PROMPTSCALE_POLICIES = {  # the policy before and after self-play DPO
    "base": promptscale_path("models", "policy.json"),
    "selfplay": promptscale_path("models", "selfplay.json"),
    "sft": promptscale_path("models", "sft.json"),  # the SFT arm (Qwen2.5-7B-Instruct on the released traces)
}
# code self-play (code_selfplay.smk) runs when code is a seed domain: its pairs join the math pairs in DPO, its
# summaries the report
PROMPTSCALE_CODE_SELFPLAY = "code" in PROMPTSCALE["seeds_data"].get("domains", ["math"])
PROMPTSCALE_CODE_SELFPLAY_SUMMARIES = (
    {f"code_{s}": promptscale_path("code_selfplay", f"{s}.json") for s in ("tests", "rollouts", "verify", "pairs")}
    if PROMPTSCALE_CODE_SELFPLAY
    else {}
)
PROMPTSCALE_WILDCARDS = {
    "role": "|".join(PROMPTSCALE["models"]),  # prompt, policy (and tester: the code self-play's unit-test writer)
    "corpus": "|".join(PROMPTSCALE_CORPORA),
    "benchmark": "|".join(PROMPTSCALE["benchmarks"]),
    "code_benchmark": "|".join(PROMPTSCALE_CODE) or "(?!)",
    "which": "q|p",
    "m": r"\d+",
    "variant": "|".join(PROMPTSCALE_SYNTH),
    "policy": "|".join(PROMPTSCALE_POLICIES),
}


def promptscale_locked(repo_type, hub):
    return PROMPTSCALE_LOCK.get(f"{repo_type}:{hub}")


def promptscale_model(which, m):
    """The JSON naming the folder of q_m or p_m (the train rule's output)."""
    return promptscale_path("models", f"{which}{m}.json")


def promptscale_train_inputs(wildcards):
    """What q_m / p_m train from: the pretrained prompt model and the cold-start triples at m = 0; the model of
    m - 1 and the kept rationales of E-step m - 1 after."""
    m = int(wildcards.m)
    inputs = {"train": promptscale_path("data", "train.jsonl")}
    if m == 0:
        return inputs | {"start": promptscale_path("models", "prompt.json")}
    return inputs | {
        "start": promptscale_model(wildcards.which, m - 1),
        "kept": promptscale_path("em", f"kept{m - 1}.jsonl"),
    }


rule promptscale_download_model:
    output:
        promptscale_path("models", "{role}.json"),
    log:
        promptscale_path("logs", "download_model_{role}.log"),
    wildcard_constraints:
        role=PROMPTSCALE_WILDCARDS["role"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=240),
    params:
        spec=lambda wc: PROMPTSCALE["models"][wc.role],
        locked=lambda wc: promptscale_locked("model", PROMPTSCALE["models"][wc.role]["hub"]),
        cache=PROMPTSCALE_CACHE,
        code=code_param("lm", "workflows/promptscale/scripts/download_model.py"),
    script:
        "scripts/download_model.py"


rule promptscale_download:
    output:
        promptscale_path("raw", "{corpus}.jsonl"),
    log:
        promptscale_path("logs", "download_{corpus}.log"),
    wildcard_constraints:
        corpus=PROMPTSCALE_WILDCARDS["corpus"],
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_medium", runtime=120),
    params:
        spec=lambda wc: PROMPTSCALE["corpora"][wc.corpus],
        locked=lambda wc: promptscale_locked("dataset", PROMPTSCALE["corpora"][wc.corpus]["hub"]),
        cache=PROMPTSCALE_CACHE,
        code=code_param("lm", "workflows/promptscale/scripts/download_corpus.py"),
    script:
        "scripts/download_corpus.py"


rule promptscale_preprocess:
    input:
        seeds=promptscale_path("raw", "seeds.jsonl"),
        code=lambda wc: promptscale_code_triples(wc),  # code_seeds.smk: the annotate jobs' triples, if code is a domain
    output:
        train=promptscale_path("data", "train.jsonl"),
        heldout=promptscale_path("data", "heldout.jsonl"),
    log:
        promptscale_path("logs", "preprocess.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        seeds_data=PROMPTSCALE["seeds_data"],
        code=code_param("lm", "workflows/promptscale/scripts/preprocess_paper.py"),
    script:
        "scripts/preprocess_paper.py"


rule promptscale_train:
    input:
        unpack(promptscale_train_inputs),
    output:
        model=promptscale_model("{which}", "{m}"),
        history=promptscale_path("em", "history_{which}{m}.json"),
    log:
        promptscale_path("logs", "train", "{which}{m}.log"),
    benchmark:
        promptscale_path("benchmarks", "train_{which}{m}.tsv")
    wildcard_constraints:
        which=PROMPTSCALE_WILDCARDS["which"],
        m=PROMPTSCALE_WILDCARDS["m"],
    conda:
        env_file("lm")
    threads: 8
    resources:
        **heavy_resources("train_node_gpu", PROMPTSCALE, stage="train"),
    params:
        sft=PROMPTSCALE["sft"],
        device=PROMPTSCALE["models"]["prompt"]["device"],
        n_procs=PROMPTSCALE["resources"]["train_gpus"],
        code=code_param("lm", "workflows/promptscale/scripts/train_paper.py"),
    script:
        "scripts/train_paper.py"


rule promptscale_sample:
    input:
        q=promptscale_model("q", "{m}"),
        train=promptscale_path("data", "train.jsonl"),
        heldout=promptscale_path("data", "heldout.jsonl"),
    output:
        promptscale_path("em", "samples{m}.jsonl"),
    log:
        promptscale_path("logs", "sample", "samples{m}.log"),
    benchmark:
        promptscale_path("benchmarks", "sample{m}.tsv")
    wildcard_constraints:
        m=PROMPTSCALE_WILDCARDS["m"],
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
    params:
        em=PROMPTSCALE["llm_em"],
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE_DTYPE,
        code=code_param("lm-serve", "workflows/promptscale/scripts/sample.py"),
    script:
        "scripts/sample.py"


rule promptscale_score:
    input:
        p=promptscale_model("p", "{m}"),
        q=promptscale_model("q", "{m}"),
        samples=promptscale_path("em", "samples{m}.jsonl"),
        train=promptscale_path("data", "train.jsonl"),
        heldout=promptscale_path("data", "heldout.jsonl"),
    output:
        kept=promptscale_path("em", "kept{m}.jsonl"),
        bound=promptscale_path("em", "bound{m}.json"),
    log:
        promptscale_path("logs", "score", "score{m}.log"),
    benchmark:
        promptscale_path("benchmarks", "score{m}.tsv")
    wildcard_constraints:
        m=PROMPTSCALE_WILDCARDS["m"],
    conda:
        env_file("lm")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="score"),
    params:
        em=PROMPTSCALE["llm_em"],
        model=PROMPTSCALE["models"]["prompt"],
        code=code_param("lm", "workflows/promptscale/scripts/score.py"),
    script:
        "scripts/score.py"


rule promptscale_synthesize:
    input:
        p=lambda wc: promptscale_model("p", PROMPTSCALE_SYNTH[wc.variant]),
        heldout=promptscale_path("data", "heldout.jsonl"),
    output:
        problems=promptscale_path("synth", "{variant}.jsonl"),
        summary=promptscale_path("synth", "{variant}.json"),
    log:
        promptscale_path("logs", "synthesize", "{variant}.log"),
    benchmark:
        promptscale_path("benchmarks", "synthesize_{variant}.tsv")
    wildcard_constraints:
        variant=PROMPTSCALE_WILDCARDS["variant"],
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
    params:
        synthesis=PROMPTSCALE["llm_synthesis"],
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE_DTYPE,
        code=code_param("lm-serve", "workflows/promptscale/scripts/synthesize.py"),
    script:
        "scripts/synthesize.py"


rule promptscale_rollouts:
    input:
        policy=promptscale_path("models", "policy.json"),
        synth=promptscale_path("synth", f"{PROMPTSCALE['selfplay']['source']}.jsonl"),
    output:
        rollouts=promptscale_path("selfplay", "rollouts.jsonl"),
        summary=promptscale_path("selfplay", "rollouts.json"),
    log:
        promptscale_path("logs", "selfplay", "rollouts.log"),
    benchmark:
        promptscale_path("benchmarks", "rollouts.tsv")
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
    params:
        selfplay=PROMPTSCALE["selfplay"],
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE["models"]["policy"]["dtype"],
        code=code_param("lm-serve", "workflows/promptscale/scripts/rollouts.py"),
    script:
        "scripts/rollouts.py"


rule promptscale_pairs:
    input:
        promptscale_path("selfplay", "rollouts.jsonl"),
    output:
        pairs=promptscale_path("selfplay", "pairs.jsonl"),
        summary=promptscale_path("selfplay", "pairs.json"),
    log:
        promptscale_path("logs", "selfplay", "pairs.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        selfplay=PROMPTSCALE["selfplay"],
        code=code_param("lm", "workflows/promptscale/scripts/pairs.py"),
    script:
        "scripts/pairs.py"


rule promptscale_dpo:
    input:
        policy=promptscale_path("models", "policy.json"),
        # the math pairs, and the code pairs when code is a seed domain
        pairs=[
            promptscale_path("selfplay", "pairs.jsonl"),
            *([promptscale_path("code_selfplay", "pairs.jsonl")] if PROMPTSCALE_CODE_SELFPLAY else []),
        ],
    output:
        model=promptscale_path("models", "selfplay.json"),
        history=promptscale_path("selfplay", "history_dpo.json"),
    log:
        promptscale_path("logs", "selfplay", "dpo.log"),
    benchmark:
        promptscale_path("benchmarks", "dpo.tsv")
    conda:
        env_file("lm")
    threads: 8
    resources:
        **heavy_resources("train_node_gpu", PROMPTSCALE, stage="train"),
    params:
        dpo=PROMPTSCALE["dpo"],
        device=PROMPTSCALE["models"]["policy"]["device"],
        n_procs=PROMPTSCALE["resources"]["train_gpus"],
        code=code_param("lm", "workflows/promptscale/scripts/dpo.py"),
    script:
        "scripts/dpo.py"


rule promptscale_sft:
    input:
        start=promptscale_path("models", "prompt.json"),
        traces=promptscale_path("raw", "sft_traces.jsonl"),
    output:
        model=promptscale_path("models", "sft.json"),
        history=promptscale_path("sft", "history.json"),
    log:
        promptscale_path("logs", "sft.log"),
    benchmark:
        promptscale_path("benchmarks", "sft.tsv")
    conda:
        env_file("lm")
    threads: 8
    resources:
        **heavy_resources("train_node_gpu", PROMPTSCALE, stage="train"),
    params:
        settings=PROMPTSCALE["sft_arm"],
        device=PROMPTSCALE["models"]["prompt"]["device"],
        n_procs=PROMPTSCALE["resources"]["train_gpus"],
        code=code_param("lm", "workflows/promptscale/scripts/sft_arm.py"),
    script:
        "scripts/sft_arm.py"


rule promptscale_evaluate:
    input:
        policy=lambda wc: PROMPTSCALE_POLICIES[wc.policy],
        rows=promptscale_path("raw", "{benchmark}.jsonl"),
    output:
        graded=promptscale_path("eval", "{policy}_{benchmark}.jsonl"),
        summary=promptscale_path("eval", "{policy}_{benchmark}.json"),
    log:
        promptscale_path("logs", "evaluate", "{policy}_{benchmark}.log"),
    benchmark:
        promptscale_path("benchmarks", "evaluate_{policy}_{benchmark}.tsv")
    wildcard_constraints:
        policy=PROMPTSCALE_WILDCARDS["policy"],
        benchmark=PROMPTSCALE_WILDCARDS["benchmark"],
    conda:
        env_file("lm-serve")
    threads: 4
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
    params:
        settings=PROMPTSCALE["llm_eval"],
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE["models"]["policy"]["dtype"],
        code=code_param("lm-serve", "workflows/promptscale/scripts/evaluate_paper.py"),
    script:
        "scripts/evaluate_paper.py"


rule promptscale_evaluate_code:
    input:
        policy=lambda wc: PROMPTSCALE_POLICIES[wc.policy],
        rows=promptscale_path("raw", "{code_benchmark}.jsonl"),
    output:
        graded=promptscale_path("eval", "{policy}_{code_benchmark}.jsonl"),
        summary=promptscale_path("eval", "{policy}_{code_benchmark}.json"),
    log:
        promptscale_path("logs", "evaluate", "{policy}_{code_benchmark}.log"),
    benchmark:
        promptscale_path("benchmarks", "evaluate_{policy}_{code_benchmark}.tsv")
    wildcard_constraints:
        policy=PROMPTSCALE_WILDCARDS["policy"],
        code_benchmark=PROMPTSCALE_WILDCARDS["code_benchmark"],
    conda:
        env_file("lm-serve")
    threads: 8
    resources:
        **heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
    params:
        settings=PROMPTSCALE["llm_eval"],
        limits=PROMPTSCALE["code_eval"],
        vllm=PROMPTSCALE["vllm"],
        dtype=PROMPTSCALE["models"]["policy"]["dtype"],
        code=code_param("lm-serve", "workflows/promptscale/scripts/evaluate_code.py"),
    script:
        "scripts/evaluate_code.py"


rule promptscale_report:
    input:
        unpack(lambda wc: keyed("codeforces", promptscale_codeforces_report())),  # codeforces.smk: Elo or why none
        **keyed("bound", {m: promptscale_path("em", f"bound{m}.json") for m in range(PROMPTSCALE_E + 1)}),
        **keyed("synthesis", {v: promptscale_path("synth", f"{v}.json") for v in PROMPTSCALE_SYNTH}),
        **keyed(
            "selfplay",
            {s: promptscale_path("selfplay", f"{s}.json") for s in ("rollouts", "pairs")}
            | PROMPTSCALE_CODE_SELFPLAY_SUMMARIES,
        ),
        **keyed(
            "eval",
            {
                (p, b): promptscale_path("eval", f"{p}_{b}.json")
                for p in PROMPTSCALE_POLICIES
                for b in [*PROMPTSCALE["benchmarks"], *PROMPTSCALE_CODE]
            },
        ),
    output:
        report=promptscale_path("report.md"),
        metrics=promptscale_path("metrics.json"),
        metrics_table=promptscale_path("metrics.parquet"),
        table_em=report(promptscale_path("tables", "em.csv"), category="promptscale", labels={"table": "EM curve"}),
        table_synthesis=report(
            promptscale_path("tables", "synthesis.csv"), category="promptscale", labels={"table": "synthesis"}
        ),
        table_benchmarks=report(
            promptscale_path("tables", "benchmarks.csv"), category="promptscale", labels={"table": "benchmarks"}
        ),
        figure_em=report(promptscale_path("figures", "em.png"), category="promptscale", labels={"figure": "EM"}),
    log:
        promptscale_path("logs", "report.log"),
    conda:
        env_file("lm")
    threads: 1
    resources:
        **resources_of("cpu_light"),
    params:
        models=PROMPTSCALE["models"],
        llm_em=PROMPTSCALE["llm_em"],
        llm_eval=PROMPTSCALE["llm_eval"],
        benchmarks=[*PROMPTSCALE["benchmarks"], *PROMPTSCALE_CODE],
        scale=RUN.scale,
        claims=PROMPTSCALE["claims"],
        claims_not_measured=PROMPTSCALE["claims_not_measured"],
        code=code_param("lm", "workflows/promptscale/scripts/report_paper.py"),
    script:
        "scripts/report_paper.py"


include: "code_seeds.smk"
include: "code_selfplay.smk"
include: "codeforces.smk"
