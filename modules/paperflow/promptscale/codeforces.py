"""PromptScale's Codeforces Elo at paper scale (spec 5/8: "Elo estimated from the pass or fail of each contest problem
(CodeElo-style). The exact protocol is unknown."), standard library only (the generate rule runs in envs/lm-serve.yaml
beside the vLLM server).

CodeElo (arXiv 2501.01257; HF dataset Qwen/CodeElo; the rating code is QwenLM/CodeElo's calc_rating.py and main.py at
commit 0bffc84f0477abe5fd641d4cb4c859318a572c70) submits up to 8 programs per problem of a rated Codeforces contest to
the live judge and turns the verdicts into the rating a human with that standing would have had. The facts used here:

- the problems: Qwen/CodeElo's test.json, columns problem_id ("2000A": contest id then index), url, title, rating,
  tags, div, time_limit_ms, memory_limit_mb, description, input, output, interaction (empty unless interactive),
  examples ([input, output] pairs), note; the text fields are Markdown (the dataset card);
- the attempts: 8 per problem, in order; a response without a code block is a failed attempt ("No code");
  CodeElo asks for C++ and submits under the language of the code block's tag (untagged: cpp, GNU G++23 14.2,
  Codeforces language id 91);
- the score (calc_rating.py): per problem of the contest, the first accepted attempt i (0-based) scores
  max(0, points - 50 i) when the problem has Codeforces points, else 1 with a penalty of 10 i; time is not counted;
- the field: contest.standings (showUnofficial=false) rows whose first member's handle has a contest.ratingChanges
  entry; a contest with 200 or fewer such participants is skipped;
- the rank: the index (0-based) of the first row the model beats (fewer points, or the same points with more
  penalty), n when it beats none; rows tied with the model count as ahead of it;
- the rating: integer bisection on [0, max old rating + 100] for the largest r whose expected place
  1 + sum_i 1 / (1 + 10^((r - old_i) / 400)) is still >= the rank (CodeElo compares the 1-based expected place with
  that 0-based rank; kept as is);
- the Elo: the mean over the contests that were rated.

expected_place / elo_from_rank / contest_score / contest_rank / contest_elo / codeelo_rating are that calculation;
codeelo_rows reads the dataset; problem_prompt, extract_program, submissions and generate make the attempts;
read_verdicts, download_contests and elo_job the rating rule; report_rows the report's rows.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.promptscale import llm_text as lt
from paperflow.promptscale import selfplay as sp

# the dataset's columns (Qwen/CodeElo's card and the public loaders that read test.json)
CODEELO_COLUMNS = (
    "problem_id",
    "url",
    "title",
    "rating",
    "tags",
    "div",
    "time_limit_ms",
    "memory_limit_mb",
    "description",
    "input",
    "output",
    "interaction",
    "examples",
    "note",
)
FORMATS = ("codeelo",)

# Codeforces language ids of the code block tags (QwenLM/CodeElo main.py's lang_map)
LANGUAGES = {
    "cpp": (91, "GNU G++23 14.2 (64 bit, msys2)"),
    "c": (43, "GNU GCC C11 5.1.0"),
    "python": (70, "PyPy 3.10 (7.3.15, 64bit)"),
    "java": (87, "Java 21 64bit"),
    "kotlin": (88, "Kotlin 1.9.21"),
    "rust": (75, "Rust 1.75.0 (2021)"),
    "go": (32, "Go 1.22.2"),
    "csharp": (79, "C# 10, .NET SDK 6.0"),
}
LANGUAGE_ALIASES = {
    "c++": "cpp",
    "cc": "cpp",
    "cxx": "cpp",
    "py": "python",
    "python3": "python",
    "rs": "rust",
    "cs": "csharp",
    "c#": "csharp",
    "kt": "kotlin",
    "golang": "go",
}
LANGUAGE_NAMES = {
    "cpp": "C++",
    "c": "C",
    "python": "Python 3",
    "java": "Java",
    "kotlin": "Kotlin",
    "rust": "Rust",
    "go": "Go",
    "csharp": "C#",
}

# the judge's verdicts: Codeforces API names and CodeElo's short ones; OK / AC accepted
ACCEPTED = {"OK", "AC", "ACCEPTED"}
REJECTED = {
    "FAILED",
    "PARTIAL",
    "COMPILATION_ERROR",
    "RUNTIME_ERROR",
    "WRONG_ANSWER",
    "PRESENTATION_ERROR",
    "TIME_LIMIT_EXCEEDED",
    "MEMORY_LIMIT_EXCEEDED",
    "IDLENESS_LIMIT_EXCEEDED",
    "SECURITY_VIOLATED",
    "CRASHED",
    "INPUT_PREPARATION_CRASHED",
    "CHALLENGED",
    "SKIPPED",
    "REJECTED",
    "WA",
    "TLE",
    "MLE",
    "RE",
    "CE",
    "ILE",
    "PE",
}

# the paper's Codeforces Elo of each policy (spec 5): Qwen3-4B-Thinking-2507 and PromptCoT 2.0 self-play, the 4B
# table's first and last rows (HF model card); PromptCoT-2.0-SFT-7B
PAPER_ELO = {"base": 1852, "selfplay": 1934, "sft": 1815}
SETTING_KEYS = (
    "corpus",
    "language",
    "attempts",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "min_participants",
    "api",
    "contest_sha256",
    "verdicts",
)


# --- the rating -----------------------------------------------------------------------------------------------------


def expected_place(rating: float, old_ratings: Sequence[float]) -> float:
    """1 + sum_i P(participant i beats a player rated `rating`), P = 1 / (1 + 10^((rating - old_i) / 400))."""
    return 1.0 + sum(1.0 / (1.0 + 10.0 ** ((rating - r) / 400.0)) for r in old_ratings)


def elo_from_rank(rank: int, old_ratings: Sequence[float]) -> int:
    """CodeElo's rating of a standing: the largest integer r in [0, max(old) + 100) whose expected place is >= `rank`
    (0 when even r = 0 falls short), found by bisection (the expected place falls as r rises)."""
    if not old_ratings:
        raise ValueError("a contest without rated participants has no rating")
    lo, hi = 0, int(max(old_ratings)) + 100
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if expected_place(mid, old_ratings) < rank:
            hi = mid
        else:
            lo = mid
    return lo


def first_accepted(verdicts: Sequence[bool]) -> int | None:
    """The 0-based attempt of the first accepted verdict, None when none is."""
    return next((i for i, ok in enumerate(verdicts) if ok), None)


def contest_score(problems: Sequence[Mapping[str, Any]], verdicts: Mapping[str, Sequence[bool]]) -> tuple[float, int]:
    """(points, penalty) of the model in a contest: per problem {"index", "points" (None: ICPC-style)} the first
    accepted attempt i scores max(0, points - 50 i), or 1 with a penalty of 10 i."""
    score, penalty = 0.0, 0
    for problem in problems:
        i = first_accepted(verdicts.get(str(problem["index"]), ()))
        if i is None:
            continue
        if problem.get("points") is not None:
            score += max(0.0, float(problem["points"]) - 50.0 * i)
        else:
            score += 1.0
            penalty += 10 * i
    return score, penalty


def contest_rank(rows: Sequence[Mapping[str, Any]], score: float, penalty: int) -> int:
    """CodeElo's rank: the index of the first standings row (in standings order) the model beats, len(rows) when
    none."""
    for i, row in enumerate(rows):
        if row["points"] < score or (row["points"] == score and row["penalty"] > penalty):
            return i
    return len(rows)


def rated_field(contest: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[float]]:
    """(standings rows, their old ratings): the rows whose handle has a rating change, in standings order."""
    old = {str(h): float(r) for h, r in contest["old_ratings"].items()}
    rows = [r for r in contest["rows"] if str(r["handle"]) in old]
    return rows, [old[str(r["handle"])] for r in rows]


def contest_elo(
    contest: Mapping[str, Any], verdicts: Mapping[str, Sequence[bool]], min_participants: int = 200
) -> dict[str, Any]:
    """The model's standing and rating in one contest ({"id", "name", "problems": [{"index", "points"}], "rows":
    [{"handle", "points", "penalty"}], "old_ratings": {handle: rating}}); "rating" None (with "skipped") when the
    rated field has `min_participants` participants or fewer, as CodeElo skips it."""
    rows, old = rated_field(contest)
    score, penalty = contest_score(contest["problems"], verdicts)
    doc = {
        "contest_id": str(contest["id"]),
        "name": contest.get("name"),
        "participants": len(rows),
        "score": score,
        "penalty": penalty,
        "solved": sum(first_accepted(verdicts.get(str(p["index"]), ())) is not None for p in contest["problems"]),
    }
    if len(rows) <= min_participants:
        return doc | {"rank": None, "rating": None, "skipped": f"{len(rows)} rated participants <= {min_participants}"}
    rank = contest_rank(rows, score, penalty)
    return doc | {"rank": rank, "rating": elo_from_rank(rank, old)}


def codeelo_rating(
    contests: Mapping[str, Mapping[str, Any]],
    verdicts: Mapping[str, Mapping[str, Sequence[bool]]],
    min_participants=200,
) -> dict[str, Any]:
    """The Elo: the mean rating over the contests of `verdicts` ({contest id: {index: [accepted per attempt]}}) that
    were rated. A contest of the verdicts without contest data is an error naming it."""
    missing = sorted(set(verdicts) - set(contests))
    if missing:
        raise ValueError(f"verdicts for contests {missing} without their standings and rating changes")
    per = [contest_elo(contests[c], verdicts[c], min_participants) for c in sorted(verdicts, key=_contest_key)]
    rated = [d["rating"] for d in per if d["rating"] is not None]
    if not rated:
        raise ValueError(f"no contest was rated: every one of {len(per)} has <= {min_participants} rated participants")
    return {
        "elo": sum(rated) / len(rated),
        "contests_rated": len(rated),
        "contests_skipped": len(per) - len(rated),
        "contests": per,
    }


def _contest_key(c: str) -> tuple[int, str]:
    return (int(c), c) if str(c).isdigit() else (math.inf, str(c))


# --- the problems ---------------------------------------------------------------------------------------------------


def split_problem_id(problem_id: str) -> tuple[str, str]:
    """("2000", "A1") of "2000A1": the contest id is the leading digits."""
    m = re.fullmatch(r"(\d+)([A-Za-z][A-Za-z0-9]*)", str(problem_id).strip())
    if not m:
        raise ValueError(f"problem_id {problem_id!r} is not <contest id><index> (e.g. 2000A)")
    return m.group(1), m.group(2)


def codeelo_rows(records: Sequence[Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
    """Qwen/CodeElo records as rows {"problem_id", "contest_id", "index", "title", "rating", "tags", "div",
    "time_limit_ms", "memory_limit_mb", "description", "input", "output", "interaction", "examples": [{"input",
    "output"}], "note", "url"}, ordered by contest then index; a missing column or a repeated id is an error."""
    rows, seen = [], set()
    for n, r in enumerate(records):
        missing = [c for c in CODEELO_COLUMNS if c not in r]
        if missing:
            raise ValueError(f"corpora.{name}: record {n} lacks columns {missing} (format codeelo)")
        contest, index = split_problem_id(r["problem_id"])
        if r["problem_id"] in seen:
            raise ValueError(f"corpora.{name}: problem {r['problem_id']} appears twice")
        seen.add(r["problem_id"])
        examples = [
            {"input": str(e[0]), "output": str(e[1])}
            if isinstance(e, (list, tuple))
            else {"input": str(e["input"]), "output": str(e["output"])}
            for e in (r["examples"] or [])
        ]
        rows.append(
            {
                "problem_id": str(r["problem_id"]),
                "contest_id": contest,
                "index": index,
                **{
                    k: ("" if r[k] is None else str(r[k]))
                    for k in ("title", "description", "input", "output", "interaction", "note", "url", "div")
                },
                "rating": None if r["rating"] is None else int(r["rating"]),
                "tags": list(r["tags"] or []),
                "time_limit_ms": int(r["time_limit_ms"]),
                "memory_limit_mb": int(r["memory_limit_mb"]),
                "examples": examples,
            }
        )
    return sorted(rows, key=lambda r: (_contest_key(r["contest_id"]), r["index"]))


def download_codeelo(name: str, spec: Mapping[str, Any], folder: str | Path, out: str) -> dict[str, Any]:
    """The CodeElo problems from the downloaded snapshot `folder` (the configured files: test.json, a JSON list or
    JSON lines) written to `out` as JSONL."""
    records = lt.read_snapshot_records(folder, spec["files"])
    rows = codeelo_rows(records, name)
    if not rows:
        raise ValueError(f"corpora.{name}: {list(spec['files'])} in {folder} hold no problem")
    lt.write_jsonl(out, rows)
    return {
        "records": len(records),
        "rows": len(rows),
        "contests": len({r["contest_id"] for r in rows}),
        "interactive": sum(bool(r["interaction"].strip()) for r in rows),
    }


# --- the attempts ---------------------------------------------------------------------------------------------------


def problem_prompt(row: Mapping[str, Any], language: str) -> str:
    """The user message: the task (a program in `language` reading stdin, writing stdout, in one fenced block with
    its language tag), then the statement: title, limits, description, input, output, interaction, examples, note."""
    name = LANGUAGE_NAMES[language]
    parts = [
        f"Solve the following competitive programming problem. Write a complete {name} program that reads from "
        "standard input and writes to standard output; it is judged on hidden tests within the time and memory limits. "
        f"Reason about the solution first, then give the whole program in one code block tagged ```{language}.",
        f"# {row['title']}",
        f"Time limit: {row['time_limit_ms']} ms. Memory limit: {row['memory_limit_mb']} MB.",
        row["description"].strip(),
    ]
    for head, key in (("Input", "input"), ("Output", "output"), ("Interaction", "interaction")):
        if row[key].strip():
            parts.append(f"## {head}\n{row[key].strip()}")
    for i, ex in enumerate(row["examples"], 1):
        parts.append(
            f"## Example {i}\nInput:\n```\n{ex['input'].rstrip()}\n```\nOutput:\n```\n{ex['output'].rstrip()}\n```"
        )
    if row["note"].strip():
        parts.append(f"## Note\n{row['note'].strip()}")
    return "\n\n".join(parts) + "\n"


def extract_program(completion: str, default_language: str) -> tuple[str, str | None]:
    """(source, language) of the last fenced block after the reasoning (`</think>`): the language from the block's tag
    (untagged: `default_language`); ("", None) without a block, (source, None) for a tag Codeforces is not asked for
    here."""
    text = sp.after_think(completion)
    blocks = re.findall(r"```[ \t]*([^\n`]*)\n(.*?)```", text, re.S)
    if not blocks:
        return "", None
    tag, source = blocks[-1]
    tag = tag.strip().lower()
    language = LANGUAGE_ALIASES.get(tag, tag) if tag else default_language
    return source.rstrip("\n") + "\n", (language if language in LANGUAGES else None)


def submissions(
    rows: Sequence[Mapping[str, Any]], samples: Sequence[Sequence[Mapping[str, Any]]], language: str
) -> list[dict[str, Any]]:
    """One row per attempt, in submission order: {"contest_id", "index", "problem_id", "attempt" (1-based), "status"
    (submit, no_code, unsupported_language), "language", "language_id", "compiler", "source", "finish_reason"}. Only
    status submit goes to the judge; the others are failed attempts."""
    out = []
    for row, choices in zip(rows, samples):
        for attempt, choice in enumerate(choices, 1):
            source, lang = extract_program(choice["text"], language)
            status = "no_code" if not source.strip() else ("submit" if lang else "unsupported_language")
            lid, compiler = LANGUAGES[lang] if status == "submit" else (None, None)
            out.append(
                {
                    "contest_id": row["contest_id"],
                    "index": row["index"],
                    "problem_id": row["problem_id"],
                    "attempt": attempt,
                    "status": status,
                    "language": lang if status == "submit" else None,
                    "language_id": lid,
                    "compiler": compiler,
                    "source": source if status == "submit" else None,
                    "finish_reason": choice.get("finish_reason"),
                }
            )
    return out


def check_settings(settings: Mapping[str, Any], policies: Sequence[str] = ()) -> dict[str, Any]:
    """The `codeforces` block: every key known, the language one of LANGUAGES, verdicts only for known policies."""
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    missing = sorted(set(SETTING_KEYS) - set(settings))
    if unknown or missing:
        raise ValueError(f"codeforces: unknown keys {unknown}, missing keys {missing}")
    if settings["language"] not in LANGUAGES:
        raise ValueError(f"codeforces.language = {settings['language']!r}: one of {sorted(LANGUAGES)}")
    stray = sorted(set(settings["verdicts"] or {}) - set(policies)) if policies else []
    if stray:
        raise ValueError(f"codeforces.verdicts: {stray} are not policies ({list(policies)})")
    return dict(settings)


POLICIES = ("base", "selfplay", "sft")  # the policies of paper.smk's PROMPTSCALE_POLICIES (a dry-run test checks)


def check_paper(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Paper scale: the `codeforces` block (check_settings) and its corpus a `corpora` entry of format codeelo;
    raises paperflow.core.config.ConfigError naming the key."""
    from paperflow.core.config import ConfigError

    if "codeforces" not in cfg:
        raise ConfigError(f"{source}: the codeforces block (the Codeforces Elo's settings) is missing")
    try:
        settings = check_settings(cfg["codeforces"], POLICIES)
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None
    if cfg.get("corpora", {}).get(settings["corpus"], {}).get("format") != "codeelo":
        raise ConfigError(
            f"{source}: codeforces.corpus = {settings['corpus']!r} is not a corpora entry of format codeelo"
        )
    return settings


def generate(
    policy_folder: str,
    policy: str,
    problems: str,
    settings: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """The generate rule: `codeforces.attempts` chat completions of the policy per CodeElo problem, each turned into
    an attempt (submissions); writes `out` (JSONL) and returns the summary. With `journal` (a file in the job's
    checkpoint folder) each problem's completions are journalled as they finish and a rerun asks only for the rest
    (vllm_server.chat_each)."""
    from paperflow.promptscale.vllm_server import chat_each, journal_at, served

    language = settings["language"]
    rows = lt.read_jsonl(problems)
    k = int(settings["attempts"])
    with journal_at(journal) as done, served(policy_folder, policy, vllm, server_log, dtype) as client:
        samples = chat_each(
            client,
            [problem_prompt(r, language) for r in rows],
            n=k,
            temperature=float(settings["temperature"]),
            top_p=float(settings["top_p"]),
            top_k=int(settings["top_k"]),
            max_tokens=int(settings["max_tokens"]),
            seed=int(settings["seed"]),
            journal=done,
        )
    subs = submissions(rows, samples, language)
    lt.write_jsonl(out, subs)
    counts = {s: sum(r["status"] == s for r in subs) for s in ("submit", "no_code", "unsupported_language")}
    return {
        "policy": policy,
        "problems": len(rows),
        "contests": len({r["contest_id"] for r in rows}),
        "attempts_per_problem": k,
        "attempts": len(subs),
        **counts,
        "language": language,
        "truncated": sum(r["finish_reason"] == "length" for r in subs) / max(len(subs), 1),
        "elo": None,
        "status": f"needs the judge's verdicts: set codeforces.verdicts.{policy}",
    }


# --- the judge's verdicts and the contests --------------------------------------------------------------------------


def read_verdicts(path: str | Path, subs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[bool]]]:
    """{contest id: {index: [accepted per attempt]}} from the judge's verdicts (JSONL {"contest_id", "index",
    "attempt", "verdict"}) for the submissions file's attempts: an attempt that was not submitted (no code) is a
    failed one; a submitted attempt without a verdict, a verdict for no submitted attempt, a repeated one or an unknown
    or unfinished verdict is an error naming the line."""
    attempts: dict[tuple[str, str, int], str] = {
        (str(s["contest_id"]), str(s["index"]), int(s["attempt"])): s["status"] for s in subs
    }
    given: dict[tuple[str, str, int], bool] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            key = (str(doc["contest_id"]), str(doc["index"]), int(doc["attempt"]))
            verdict = str(doc["verdict"]).strip().upper()
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}:{n}: a verdict is {{contest_id, index, attempt, verdict}} ({error!r})") from None
        if key not in attempts or attempts[key] != "submit":
            raise ValueError(f"{path}:{n}: {key[0]}{key[1]} attempt {key[2]} was not submitted (submissions file)")
        if key in given:
            raise ValueError(f"{path}:{n}: a second verdict for {key[0]}{key[1]} attempt {key[2]}")
        if verdict not in ACCEPTED | REJECTED:
            raise ValueError(
                f"{path}:{n}: verdict {doc['verdict']!r} is neither accepted ({sorted(ACCEPTED)}) nor a "
                "final rejection (TESTING and unknown verdicts are refused)"
            )
        given[key] = verdict in ACCEPTED
    lacking = sorted(k for k, status in attempts.items() if status == "submit" and k not in given)
    if lacking:
        shown = ", ".join(f"{c}{i} attempt {a}" for c, i, a in lacking[:5])
        raise ValueError(f"{path}: {len(lacking)} submitted attempts have no verdict ({shown}...)")
    out: dict[str, dict[str, list[bool]]] = {}
    for key in sorted(attempts, key=lambda k: k[2]):
        out.setdefault(key[0], {}).setdefault(key[1], []).append(given.get(key, False))
    return out


def contest_urls(api: str, contest_id: str) -> dict[str, str]:
    """The Codeforces API calls CodeElo's calc_rating.py makes for a contest."""
    base = api.rstrip("/")
    return {
        "standings": f"{base}/contest.standings?contestId={contest_id}&showUnofficial=false",
        "rating_changes": f"{base}/contest.ratingChanges?contestId={contest_id}",
    }


def compact_contest(contest_id: str, standings: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of the API answers the rating needs: problems (index, points), rows (first member's handle, points,
    penalty) in standings order, and the old rating of every handle with a rating change."""
    for what, doc in (("contest.standings", standings), ("contest.ratingChanges", changes)):
        if doc.get("status") != "OK" or "result" not in doc:
            raise ValueError(f"contest {contest_id}: {what} answered {doc.get('status')!r}: {doc.get('comment')}")
    result = standings["result"]
    return {
        "id": str(contest_id),
        "name": result["contest"]["name"],
        "problems": [{"index": p["index"], "points": p.get("points")} for p in result["problems"]],
        "rows": [
            {"handle": r["party"]["members"][0]["handle"], "points": r["points"], "penalty": r["penalty"]}
            for r in result["rows"]
        ],
        "old_ratings": {c["handle"]: c["oldRating"] for c in changes["result"]},
    }


def download_contests(problems: str, settings: Mapping[str, Any], cache: str, out: str) -> dict[str, Any]:
    """Every contest of the CodeElo problems (`problems`, the corpus's rows): contest.standings and
    contest.ratingChanges fetched once each with their sha256 (`codeforces.contest_sha256` by URL, else
    config/locks/promptscale.json written by `paperflow pin promptscale`), compacted into `out` (JSON {contest id:
    contest})."""
    from paperflow.core.download import pinned_fetch

    contests = sorted({r["contest_id"] for r in lt.read_jsonl(problems)}, key=_contest_key)
    known = settings.get("contest_sha256") or {}
    doc = {}
    for cid in contests:
        answers = {}
        for what, url in contest_urls(settings["api"], cid).items():
            dest = Path(cache) / "codeforces" / f"{cid}_{what}.json"
            pinned_fetch(url, dest, known.get(url), slug="promptscale", key=f"codeforces.contest_sha256[{url!r}]")
            answers[what] = json.loads(dest.read_text(encoding="utf-8"))
        doc[cid] = compact_contest(cid, answers["standings"], answers["rating_changes"])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc) + "\n")
    return {"contests": len(doc), "rows": sum(len(c["rows"]) for c in doc.values())}


def elo_job(
    policy: str, subs_path: str, verdicts_path: str, contests_path: str, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The Elo rule: the judge's verdicts of the policy's attempts, scored in every contest and averaged."""
    subs = lt.read_jsonl(subs_path)
    verdicts = read_verdicts(verdicts_path, subs)
    contests = json.loads(Path(contests_path).read_text(encoding="utf-8"))
    rating = codeelo_rating(contests, verdicts, int(settings["min_participants"]))
    accepted = sum(any(v) for c in verdicts.values() for v in c.values())
    return {
        "policy": policy,
        "verdicts": str(verdicts_path),
        "problems": sum(len(c) for c in verdicts.values()),
        "problems_accepted": accepted,
        **rating,
        "status": "computed",
    }


# --- the report -----------------------------------------------------------------------------------------------------


def report_rows(docs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy: the Elo (the Elo rule's output) or why there is none (the generate rule's summary), beside
    the paper's Elo of that row (spec 5)."""
    rows = []
    for policy, doc in sorted(docs.items()):
        rows.append(
            {
                "policy": policy,
                "codeforces_elo": doc.get("elo"),
                "contests_rated": doc.get("contests_rated"),
                "problems": doc.get("problems"),
                "status": doc["status"],
                "paper": PAPER_ELO.get(policy),
            }
        )
    return rows
