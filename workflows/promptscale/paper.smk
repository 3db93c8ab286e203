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
# the seed domains (math only where the config names none); code seeds (code_seeds.smk) and code self-play
# (code_selfplay.smk) run when code is one: its pairs join the math pairs in DPO, its summaries the report
PROMPTSCALE_DOMAINS = list(PROMPTSCALE["seeds_data"]["domains"]) if "domains" in PROMPTSCALE["seeds_data"] else ["math"]
PROMPTSCALE_CODE_SELFPLAY = "code" in PROMPTSCALE_DOMAINS
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


paper_stages(
    "promptscale",
    PROMPTSCALE,
    promptscale_path,
    hub_model_stage(
        "promptscale",
        "download_model",
        lambda wc: PROMPTSCALE["models"][wc.role],
        lambda wc: f"models.{wc.role}.revision",
        PROMPTSCALE_CACHE,
        promptscale_path("models", "{role}.json"),
        extra=lambda wc: {"role": wc.role},
        resources=resources_of("cpu_medium", runtime=240),
        wildcards={"role": PROMPTSCALE_WILDCARDS["role"]},
        log="download_model_{role}.log",
        params={"locked": lambda wc: promptscale_locked("model", PROMPTSCALE["models"][wc.role]["hub"])},
    ),
    stage(
        "download",
        script="download_corpus.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=120),
        output=promptscale_path("raw", "{corpus}.jsonl"),
        wildcards={"corpus": PROMPTSCALE_WILDCARDS["corpus"]},
        log="download_{corpus}.log",
        params={
            "spec": lambda wc: PROMPTSCALE["corpora"][wc.corpus],
            "locked": lambda wc: promptscale_locked("dataset", PROMPTSCALE["corpora"][wc.corpus]["hub"]),
            "cache": PROMPTSCALE_CACHE,
        },
    ),
    stage(
        "preprocess",
        script="preprocess_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "seeds": promptscale_path("raw", "seeds.jsonl"),
            "code": promptscale_code_triples,  # the annotate jobs' triples (code_seeds.smk), if code is a domain
        },
        output={
            "train": promptscale_path("data", "train.jsonl"),
            "heldout": promptscale_path("data", "heldout.jsonl"),
        },
        reads=["seeds_data"],
    ),
    stage(
        "train",
        script="train_paper.py",
        env="lm",
        resources=heavy_resources("train_node_gpu", PROMPTSCALE, stage="train"),
        unpack=promptscale_train_inputs,
        output={
            "model": promptscale_model("{which}", "{m}"),
            "history": promptscale_path("em", "history_{which}{m}.json"),
        },
        wildcards={"which": PROMPTSCALE_WILDCARDS["which"], "m": PROMPTSCALE_WILDCARDS["m"]},
        tag="{which}{m}",
        benchmark=True,
        threads=8,
        reads=["sft"],
        params={
            "device": PROMPTSCALE["models"]["prompt"]["device"],
            "n_procs": PROMPTSCALE["resources"]["train_gpus"],
        },
    ),
    stage(
        "sample",
        script="sample.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
        input={
            "q": promptscale_model("q", "{m}"),
            "train": promptscale_path("data", "train.jsonl"),
            "heldout": promptscale_path("data", "heldout.jsonl"),
        },
        output=promptscale_path("em", "samples{m}.jsonl"),
        wildcards={"m": PROMPTSCALE_WILDCARDS["m"]},
        tag="samples{m}",
        benchmark="sample{m}.tsv",
        threads=4,
        reads=["vllm"],
        params={"em": PROMPTSCALE["llm_em"], "dtype": PROMPTSCALE_DTYPE},
    ),
    stage(
        "score",
        script="score.py",
        env="lm",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="score"),
        input={
            "p": promptscale_model("p", "{m}"),
            "q": promptscale_model("q", "{m}"),
            "samples": promptscale_path("em", "samples{m}.jsonl"),
            "train": promptscale_path("data", "train.jsonl"),
            "heldout": promptscale_path("data", "heldout.jsonl"),
        },
        output={
            "kept": promptscale_path("em", "kept{m}.jsonl"),
            "bound": promptscale_path("em", "bound{m}.json"),
        },
        wildcards={"m": PROMPTSCALE_WILDCARDS["m"]},
        tag="score{m}",
        benchmark="score{m}.tsv",
        threads=4,
        params={"em": PROMPTSCALE["llm_em"], "model": PROMPTSCALE["models"]["prompt"]},
    ),
    stage(
        "synthesize",
        script="synthesize.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
        input={
            "p": lambda wc: promptscale_model("p", PROMPTSCALE_SYNTH[wc.variant]),
            "heldout": promptscale_path("data", "heldout.jsonl"),
        },
        output={
            "problems": promptscale_path("synth", "{variant}.jsonl"),
            "summary": promptscale_path("synth", "{variant}.json"),
        },
        wildcards={"variant": PROMPTSCALE_WILDCARDS["variant"]},
        tag="{variant}",
        benchmark=True,
        threads=4,
        reads=["vllm"],
        params={"synthesis": PROMPTSCALE["llm_synthesis"], "dtype": PROMPTSCALE_DTYPE},
    ),
    stage(
        "rollouts",
        script="rollouts.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
        input={
            "policy": promptscale_path("models", "policy.json"),
            "synth": promptscale_path("synth", f"{PROMPTSCALE['selfplay']['source']}.jsonl"),
        },
        output={
            "rollouts": promptscale_path("selfplay", "rollouts.jsonl"),
            "summary": promptscale_path("selfplay", "rollouts.json"),
        },
        log="selfplay/rollouts.log",
        benchmark=True,
        threads=4,
        reads=["selfplay", "vllm"],
        params={"dtype": PROMPTSCALE["models"]["policy"]["dtype"]},
    ),
    stage(
        "pairs",
        script="pairs.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input=promptscale_path("selfplay", "rollouts.jsonl"),
        output={
            "pairs": promptscale_path("selfplay", "pairs.jsonl"),
            "summary": promptscale_path("selfplay", "pairs.json"),
        },
        log="selfplay/pairs.log",
        reads=["selfplay"],
    ),
    stage(
        "dpo",
        script="dpo.py",
        env="lm",
        resources=heavy_resources("train_node_gpu", PROMPTSCALE, stage="train"),
        input={
            "policy": promptscale_path("models", "policy.json"),
            # the math pairs, and the code pairs when code is a seed domain
            "pairs": [
                promptscale_path("selfplay", "pairs.jsonl"),
                *([promptscale_path("code_selfplay", "pairs.jsonl")] if PROMPTSCALE_CODE_SELFPLAY else []),
            ],
        },
        output={
            "model": promptscale_path("models", "selfplay.json"),
            "history": promptscale_path("selfplay", "history_dpo.json"),
        },
        log="selfplay/dpo.log",
        benchmark=True,
        threads=8,
        reads=["dpo"],
        params={
            "device": PROMPTSCALE["models"]["policy"]["device"],
            "n_procs": PROMPTSCALE["resources"]["train_gpus"],
        },
    ),
    stage(
        "sft",
        script="sft_arm.py",
        env="lm",
        resources=heavy_resources("train_node_gpu", PROMPTSCALE, stage="train"),
        input={
            "start": promptscale_path("models", "prompt.json"),
            "traces": promptscale_path("raw", "sft_traces.jsonl"),
        },
        output={
            "model": promptscale_path("models", "sft.json"),
            "history": promptscale_path("sft", "history.json"),
        },
        benchmark=True,
        threads=8,
        params={
            "settings": PROMPTSCALE["sft_arm"],
            "device": PROMPTSCALE["models"]["prompt"]["device"],
            "n_procs": PROMPTSCALE["resources"]["train_gpus"],
        },
    ),
    stage(
        "evaluate",
        script="evaluate_paper.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
        input={
            "policy": lambda wc: PROMPTSCALE_POLICIES[wc.policy],
            "rows": promptscale_path("raw", "{benchmark}.jsonl"),
        },
        output={
            "graded": promptscale_path("eval", "{policy}_{benchmark}.jsonl"),
            "summary": promptscale_path("eval", "{policy}_{benchmark}.json"),
        },
        wildcards={"policy": PROMPTSCALE_WILDCARDS["policy"], "benchmark": PROMPTSCALE_WILDCARDS["benchmark"]},
        tag="{policy}_{benchmark}",
        benchmark=True,
        threads=4,
        reads=["vllm"],
        params={"settings": PROMPTSCALE["llm_eval"], "dtype": PROMPTSCALE["models"]["policy"]["dtype"]},
    ),
    stage(
        "evaluate_code",
        script="evaluate_code.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
        input={
            "policy": lambda wc: PROMPTSCALE_POLICIES[wc.policy],
            "rows": promptscale_path("raw", "{code_benchmark}.jsonl"),
        },
        output={
            "graded": promptscale_path("eval", "{policy}_{code_benchmark}.jsonl"),
            "summary": promptscale_path("eval", "{policy}_{code_benchmark}.json"),
        },
        wildcards={
            "policy": PROMPTSCALE_WILDCARDS["policy"],
            "code_benchmark": PROMPTSCALE_WILDCARDS["code_benchmark"],
        },
        tag="{policy}_{code_benchmark}",
        log_dir="evaluate",
        benchmark=True,
        threads=8,
        reads=["vllm"],
        params={
            "settings": PROMPTSCALE["llm_eval"],
            "limits": PROMPTSCALE["code_eval"],
            "dtype": PROMPTSCALE["models"]["policy"]["dtype"],
        },
    ),
    stage(
        "report",
        script="report_paper.py",
        env="lm",
        resources=resources_of("cpu_light"),
        unpack=lambda wc: keyed("codeforces", promptscale_codeforces_report()),  # codeforces.smk: Elo or why none
        input={
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
        },
        output={
            "report": promptscale_path("report.md"),
            "metrics": promptscale_path("metrics.json"),
            "metrics_table": promptscale_path("metrics.parquet"),
            "table_em": report(
                promptscale_path("tables", "em.csv"), category="promptscale", labels={"table": "EM curve"}
            ),
            "table_synthesis": report(
                promptscale_path("tables", "synthesis.csv"), category="promptscale", labels={"table": "synthesis"}
            ),
            "table_benchmarks": report(
                promptscale_path("tables", "benchmarks.csv"), category="promptscale", labels={"table": "benchmarks"}
            ),
            "figure_em": report(promptscale_path("figures", "em.png"), category="promptscale", labels={"figure": "EM"}),
        },
        reads=["models", "llm_em", "llm_eval", "claims", "claims_not_measured"],
        params={"benchmarks": [*PROMPTSCALE["benchmarks"], *PROMPTSCALE_CODE], "scale": RUN.scale},
    ),
)


include: "code_seeds.smk"
include: "code_selfplay.smk"
include: "codeforces.smk"
