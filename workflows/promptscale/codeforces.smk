# promptscale at paper scale, included by paper.smk: Codeforces Elo, CodeElo-style, the policies' submissions for
# CodeElo's contest problems and the rating from the judge's verdicts (spec 8).
# The problems of `codeforces.corpus` (Qwen/CodeElo, downloaded by promptscale_download as format codeelo); per policy
# `codeforces.attempts` programs per problem from vLLM, written as a submissions file for a judge bot (contest, index,
# attempt, language id, source). The Elo needs the live Codeforces judge, which no job here reaches: a policy whose
# judge's verdicts are named in `codeforces.verdicts` gets the Elo job (the contests' standings and rating changes from
# the Codeforces API, sha256-pinned, then QwenLM/CodeElo's calculation: paperflow.promptscale.codeforces); the report
# shows the Elo, or for the others which key to set. No Elo is ever estimated without the verdicts.
# (The codeforces block is checked when the config loads: promptscale.settings.check_paper.)
from paperflow.promptscale.codeforces import POLICIES as PROMPTSCALE_CF_POLICIES

if set(PROMPTSCALE_CF_POLICIES) != set(PROMPTSCALE_POLICIES):  # the config check names verdicts' policies by these
    raise ValueError(f"codeforces.POLICIES {PROMPTSCALE_CF_POLICIES} != the policies {list(PROMPTSCALE_POLICIES)}")
PROMPTSCALE_CF = PROMPTSCALE["codeforces"]
PROMPTSCALE_CF_VERDICTS = dict(PROMPTSCALE_CF["verdicts"] or {})  # the policies the judge has answered for


paper_stages(
    "promptscale",
    PROMPTSCALE,
    promptscale_path,
    stage(
        "codeforces_generate",
        script="codeforces_generate.py",
        env="lm-serve",
        resources=heavy_resources("infer_gpu", PROMPTSCALE, stage="sample"),
        input={
            "policy": lambda wc: PROMPTSCALE_POLICIES[wc.policy],
            "problems": promptscale_path("raw", f"{PROMPTSCALE_CF['corpus']}.jsonl"),
        },
        output={
            "submissions": promptscale_path("codeforces", "{policy}.jsonl"),
            "summary": promptscale_path("codeforces", "{policy}.json"),
        },
        wildcards={"policy": PROMPTSCALE_WILDCARDS["policy"]},
        tag="{policy}",
        log="codeforces/{policy}.log",
        benchmark=True,
        threads=4,
        reads=["vllm"],
        params={"settings": PROMPTSCALE_CF, "dtype": PROMPTSCALE["models"]["policy"]["dtype"]},
    ),
    stage(
        "codeforces_download_contests",
        script="codeforces_contests.py",
        env="lm",
        resources=resources_of("cpu_medium", runtime=120),
        # no input: the script reads the problems from the pinned snapshot, so that `paperflow pin` (--until every
        # download rule) can run this job beside promptscale_download and record the API answers' sha256
        output=promptscale_path("codeforces", "contests.json"),
        log="codeforces/download_contests.log",
        params={
            "corpus": PROMPTSCALE_CF["corpus"],
            "spec": PROMPTSCALE["corpora"][PROMPTSCALE_CF["corpus"]],
            "locked": promptscale_locked("dataset", PROMPTSCALE["corpora"][PROMPTSCALE_CF["corpus"]]["hub"]),
            "settings": PROMPTSCALE_CF,
            "cache": PROMPTSCALE_CACHE,
        },
    ),
    stage(
        "codeforces_elo",
        script="codeforces_elo.py",
        env="lm",
        resources=resources_of("cpu_light"),
        input={
            "submissions": promptscale_path("codeforces", "{policy}.jsonl"),
            "verdicts": lambda wc: PROMPTSCALE_CF_VERDICTS[wc.policy],
            "contests": promptscale_path("codeforces", "contests.json"),
        },
        output=promptscale_path("codeforces", "{policy}_elo.json"),
        wildcards={"policy": "|".join(PROMPTSCALE_CF_VERDICTS) or "(?!)"},
        log="codeforces/elo_{policy}.log",
        params={"settings": PROMPTSCALE_CF},
    ),
)
