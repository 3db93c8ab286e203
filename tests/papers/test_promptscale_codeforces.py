"""promptscale's Codeforces Elo at paper scale, offline: CodeElo's rating (QwenLM/CodeElo calc_rating.py) checked on
closed forms (a field all rated R), against a brute-force scan and on hand-made contests (points and ICPC scoring,
ties, skipped small fields, the mean over contests); the judge's verdicts parsed with every error named; the
problems read from a fake Hub snapshot in Qwen/CodeElo's columns; the generate job against the shared fake OpenAI
server writing the submissions file; the contest download refused unpinned; the paper DAG without verdicts (no Elo
job, the report says which key to set) and with them (the Elo job on CPU); config errors by name."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
import test_promptscale_paper as base
from fake_openai import FakeOpenAI, chat_choices

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.promptscale import codeforces as cf
from paperflow.promptscale import llm_text as lt
from paperflow.promptscale import paper
from paperflow.promptscale.paper_report import codeforces_sections

hub, cfg, tiny_model_folder = base.hub, base.cfg, base.tiny_model_folder  # the fixtures of the paper-scale tests


# --- the rating -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [400, 450, 500, 700, 900, 1000])
def test_a_field_all_rated_r_gives_the_closed_form_rating(rank):
    # n players rated R: place(x) = 1 + n / (1 + 10^((x - R) / 400)) >= rank  <=>  x <= R + 400 log10(n / (rank - 1) - 1)
    n, r = 1000, 1500
    exact = r + 400 * math.log10(n / (rank - 1) - 1)
    assert exact < r + 99  # inside CodeElo's search interval [0, max + 100)
    assert cf.elo_from_rank(rank, [r] * n) == math.floor(exact)


def test_the_bounds_of_the_search():
    field = [1500] * 1000
    assert cf.elo_from_rank(0, field) == 1599  # beats everyone: the top of [0, max + 100)
    assert cf.elo_from_rank(1, field) == 1599
    assert cf.elo_from_rank(1001, field) == 0  # last: the place 1001 is out of reach above 0
    with pytest.raises(ValueError, match="without rated participants"):
        cf.elo_from_rank(3, [])


def test_the_bisection_agrees_with_a_brute_force_scan_and_rises_with_a_better_rank():
    rng = random.Random(0)
    field = [rng.randint(400, 3200) for _ in range(300)]
    top = max(field) + 100

    def scan(rank):  # the largest integer in [0, top) whose expected place is still >= rank
        return max([x for x in range(top) if cf.expected_place(x, field) >= rank], default=0)

    ratings = [cf.elo_from_rank(rank, field) for rank in range(0, 302, 15)]
    assert ratings == [scan(rank) for rank in range(0, 302, 15)]
    assert all(a > b for a, b in zip(ratings[1:], ratings[2:]))  # strictly lower for every worse rank
    assert ratings[0] == top - 1


def field_contest(cid, n, points=None):
    """A contest of n rated participants 1500 (handles h0..), all solved the first problem with penalty 20 * i % 7;
    one unrated row."""
    rows = [{"handle": f"h{i}", "points": 2.0 if i < n // 2 else 1.0, "penalty": 10 * (i % 5)} for i in range(n)]
    rows.sort(key=lambda r: (-r["points"], r["penalty"]))
    rows.insert(3, {"handle": "unrated", "points": 99.0, "penalty": 0})
    return {
        "id": cid,
        "name": f"Round {cid}",
        "problems": [{"index": "A", "points": points}, {"index": "B", "points": points}],
        "rows": rows,
        "old_ratings": {f"h{i}": 1500 for i in range(n)},
    }


def test_points_and_icpc_scoring_the_rank_with_ties_and_the_mean_over_rated_contests():
    assert cf.contest_score(
        [{"index": "A", "points": 500}, {"index": "B", "points": 1000}], {"A": [False, False, True], "B": [False] * 8}
    ) == (400.0, 0)
    assert cf.contest_score([{"index": "A", "points": 500}], {"A": [False] * 11 + [True]}) == (0.0, 0)  # floor at 0
    assert cf.contest_score([{"index": "A"}, {"index": "B"}], {"A": [False, True], "B": [True]}) == (2.0, 10)
    rows = [{"points": 2, "penalty": 0}, {"points": 2, "penalty": 10}, {"points": 1, "penalty": 0}]
    assert cf.contest_rank(rows, 2, 10) == 2  # the tied row counts ahead
    assert cf.contest_rank(rows, 2, 5) == 1 and cf.contest_rank(rows, 3, 99) == 0 and cf.contest_rank(rows, 0, 0) == 3

    big, small = field_contest("2000", 400), field_contest("2001", 150)
    # one problem at the second attempt: 1 point, penalty 10: behind the 200 two-solvers and the 1-solvers with less
    got = cf.contest_elo(big, {"A": [False, True]})
    ahead = 200 + sum(1 for i in range(200, 400) if 10 * (i % 5) <= 10)
    assert (got["score"], got["penalty"], got["participants"], got["rank"]) == (1.0, 10, 400, ahead)
    assert got["rating"] == math.floor(1500 + 400 * math.log10(400 / (ahead - 1) - 1))
    assert cf.contest_elo(small, {"A": [True]})["skipped"] == "150 rated participants <= 200"
    both = cf.codeelo_rating(
        {"2000": big, "2001": small, "2002": field_contest("2002", 400)},
        {"2000": {"A": [False, True]}, "2001": {"A": [True]}, "2002": {"A": [True], "B": [True]}},
    )
    assert (both["contests_rated"], both["contests_skipped"]) == (2, 1)
    assert both["elo"] == (got["rating"] + 1599) / 2  # 2002: two solved, no penalty: first place
    with pytest.raises(ValueError, match=r"contests \['2003'\] without their standings"):
        cf.codeelo_rating({"2000": big}, {"2003": {"A": [True]}})
    with pytest.raises(ValueError, match="no contest was rated"):
        cf.codeelo_rating({"2001": small}, {"2001": {"A": [True]}})


def test_the_api_answers_are_compacted_and_an_error_answer_is_named():
    standings = {
        "status": "OK",
        "result": {
            "contest": {"id": 2000, "name": "Round 1"},
            "problems": [{"contestId": 2000, "index": "A", "points": 500.0}, {"contestId": 2000, "index": "B"}],
            "rows": [{"party": {"members": [{"handle": "x"}]}, "points": 500.0, "penalty": 0, "rank": 1}],
        },
    }
    changes = {"status": "OK", "result": [{"handle": "x", "oldRating": 1400, "newRating": 1450}]}
    doc = cf.compact_contest("2000", standings, changes)
    assert doc == {
        "id": "2000",
        "name": "Round 1",
        "problems": [{"index": "A", "points": 500.0}, {"index": "B", "points": None}],
        "rows": [{"handle": "x", "points": 500.0, "penalty": 0}],
        "old_ratings": {"x": 1400},
    }
    with pytest.raises(ValueError, match="contest 2000: contest.ratingChanges answered 'FAILED': not rated"):
        cf.compact_contest("2000", standings, {"status": "FAILED", "comment": "not rated"})
    urls = cf.contest_urls("https://codeforces.com/api/", "2000")
    assert urls["standings"] == "https://codeforces.com/api/contest.standings?contestId=2000&showUnofficial=false"
    assert urls["rating_changes"] == "https://codeforces.com/api/contest.ratingChanges?contestId=2000"


def test_an_unpinned_contest_download_is_refused_naming_the_key_and_the_pin_command(hub, cfg, tmp_path):
    paper.download_corpus("codeelo", cfg["corpora"]["codeelo"], str(tmp_path / "cache"), str(tmp_path / "p.jsonl"))
    settings = {"api": "https://codeforces.invalid/api", "contest_sha256": {}}
    with pytest.raises(
        UnpinnedDownload, match=r"codeforces\.contest_sha256.*contestId=2000&.*paperflow pin promptscale"
    ):
        cf.download_contests(str(tmp_path / "p.jsonl"), settings, str(tmp_path / "cache"), str(tmp_path / "c.json"))
    assert not (tmp_path / "c.json").exists()


def test_paperflow_pin_plans_the_contest_download_beside_the_other_downloads(dry_repo):
    from conftest import run_snakemake

    rules = ["promptscale_download", "promptscale_download_model", "promptscale_codeforces_download_contests"]
    proc = run_snakemake(dry_repo, "-n", "--config", "scale=paper", "papers=[promptscale]", "--until", *rules)
    counts = dict(re.findall(r"^(promptscale_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts["promptscale_codeforces_download_contests"] == "1"  # no verdicts needed to pin the contests


# --- the verdicts ---------------------------------------------------------------------------------------------------

SUBS = [
    {"contest_id": "2000", "index": "A", "attempt": 1, "status": "submit"},
    {"contest_id": "2000", "index": "A", "attempt": 2, "status": "no_code"},
    {"contest_id": "2000", "index": "A", "attempt": 3, "status": "submit"},
    {"contest_id": "2001", "index": "B", "attempt": 1, "status": "submit"},
]


def write_verdicts(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_verdicts_are_read_per_attempt_with_unsubmitted_attempts_failed(tmp_path):
    path = write_verdicts(
        tmp_path / "v.jsonl",
        [
            {"contest_id": 2000, "index": "A", "attempt": 3, "verdict": "OK"},
            {"contest_id": 2000, "index": "A", "attempt": 1, "verdict": "WRONG_ANSWER"},
            {"contest_id": "2001", "index": "B", "attempt": 1, "verdict": "tle"},
        ],
    )
    assert cf.read_verdicts(path, SUBS) == {"2000": {"A": [False, False, True]}, "2001": {"B": [False]}}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["{not json"], r"v\.jsonl:1: a verdict is"),
        ([{"contest_id": 2000, "index": "A", "verdict": "OK"}], r"v\.jsonl:1: a verdict is .*attempt"),
        ([{"contest_id": 2000, "index": "A", "attempt": 2, "verdict": "OK"}], "2000A attempt 2 was not submitted"),
        ([{"contest_id": 2000, "index": "C", "attempt": 1, "verdict": "OK"}], "2000C attempt 1 was not submitted"),
        ([{"contest_id": 2000, "index": "A", "attempt": 1, "verdict": "TESTING"}], "verdict 'TESTING' is neither"),
        ([{"contest_id": 2000, "index": "A", "attempt": 1, "verdict": "OK"}] * 2, ":2: a second verdict for 2000A"),
        ([{"contest_id": 2000, "index": "A", "attempt": 1, "verdict": "OK"}], "2 submitted attempts have no verdict"),
    ],
)
def test_verdict_errors_are_named(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        cf.read_verdicts(write_verdicts(tmp_path / "v.jsonl", rows), SUBS)


# --- the problems and the attempts ----------------------------------------------------------------------------------


def test_codeelo_problems_are_read_from_the_pinned_snapshot_in_its_columns(hub, cfg, tmp_path):
    spec = cfg["corpora"]["codeelo"]
    assert spec["format"] == "codeelo" and re.fullmatch(r"[0-9a-f]{40}", spec["revision"])
    info = paper.download_corpus("codeelo", spec, str(tmp_path / "cache"), str(tmp_path / "ce.jsonl"))
    assert hub[0]["revision"] == spec["revision"] and hub[0]["written"] == ["test.json"]  # not README.md
    assert {k: info[k] for k in ("records", "rows", "contests", "interactive")} == {
        "records": 2,
        "rows": 2,
        "contests": 2,
        "interactive": 1,
    }
    rows = lt.read_jsonl(tmp_path / "ce.jsonl")
    assert [(r["contest_id"], r["index"]) for r in rows] == [("2000", "A"), ("2001", "B")]  # by contest
    assert rows[0]["examples"] == [{"input": "1 2\n", "output": "3\n"}] and rows[1]["rating"] is None
    # the same records as one JSON list (test.json's other possible layout), a missing column named
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "test.json").write_text(json.dumps(base.codeelo_records()))
    assert cf.download_codeelo("codeelo", spec, folder, str(tmp_path / "b.jsonl"))["rows"] == 2
    broken = [{k: v for k, v in r.items() if k != "time_limit_ms"} for r in base.codeelo_records()]
    (folder / "test.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"corpora\.codeelo: record 0 lacks columns \['time_limit_ms'\]"):
        cf.download_codeelo("codeelo", spec, folder, str(tmp_path / "b.jsonl"))
    with pytest.raises(ValueError, match="problem_id 'A2000'"):
        cf.split_problem_id("A2000")


def test_program_extraction_takes_the_last_block_after_the_reasoning_and_its_language():
    text = "<think>```python\nprint(0)\n```</think>Plan.\n```cpp\nint main(){}\n```\nDone."
    assert cf.extract_program(text, "cpp") == ("int main(){}\n", "cpp")
    assert cf.extract_program("```Python3\nprint(1)\n```", "cpp") == ("print(1)\n", "python")
    assert cf.extract_program("```\nint main(){}\n```", "cpp") == ("int main(){}\n", "cpp")  # untagged: configured
    assert cf.extract_program("```haskell\nmain = pure ()\n```", "cpp") == ("main = pure ()\n", None)
    assert cf.extract_program("<think>```cpp\nx\n```</think> no block", "cpp") == ("", None)


def test_the_generate_job_writes_a_submissions_file_a_judge_bot_can_take(tmp_path):
    rows = cf.codeelo_rows(base.codeelo_records(), "codeelo")
    lt.write_jsonl(tmp_path / "ce.jsonl", rows)
    answers = [
        "<think>sum</think>```cpp\nint main(){}\n```",
        "```python\nprint(sum(map(int, input().split())))\n```",
        "I cannot solve it.",
        "```haskell\nmain = pure ()\n```",
    ]
    seen = []

    def policy(path, body):
        seen.append(body)
        return chat_choices(answers[: body["n"]])

    settings = dict(load_paper_config("promptscale", "paper")["codeforces"], attempts=4)
    with FakeOpenAI(policy, name="selfplay") as server:
        summary = cf.generate(
            "/m",
            "selfplay",
            str(tmp_path / "ce.jsonl"),
            settings,
            base.vllm_cfg(server.url.removesuffix("/v1")),
            "bfloat16",
            str(tmp_path / "s.jsonl"),
            str(tmp_path / "vllm.log"),
        )
    seen.sort(key=lambda b: b["seed"])  # the client sends the problems concurrently: any arrival order
    assert [(b["n"], b["temperature"], b["top_p"], b["seed"]) for b in seen] == [(4, 0.6, 0.95, 0), (4, 0.6, 0.95, 1)]
    message = seen[0]["messages"][0]["content"]
    assert "C++ program" in message and "Time limit: 1000 ms. Memory limit: 256 MB." in message
    assert "## Example 1\nInput:\n```\n1 2\n```\nOutput:\n```\n3\n```" in message and "## Note\n1+2=3." in message
    assert "## Interaction\nAsk ? y." in seen[1]["messages"][0]["content"]
    subs = lt.read_jsonl(tmp_path / "s.jsonl")
    assert [(s["problem_id"], s["attempt"], s["status"], s["language_id"]) for s in subs[:4]] == [
        ("2000A", 1, "submit", 91),
        ("2000A", 2, "submit", 70),
        ("2000A", 3, "no_code", None),
        ("2000A", 4, "unsupported_language", None),
    ]
    assert (
        subs[0]["source"] == "int main(){}\n"
        and subs[0]["compiler"].startswith("GNU G++23")
        and subs[2]["source"] is None
    )
    assert {
        k: summary[k] for k in ("problems", "contests", "attempts", "submit", "no_code", "unsupported_language")
    } == {"problems": 2, "contests": 2, "attempts": 8, "submit": 4, "no_code": 2, "unsupported_language": 2}
    assert (
        summary["elo"] is None and summary["status"] == "needs the judge's verdicts: set codeforces.verdicts.selfplay"
    )


def test_the_elo_job_scores_the_judges_verdicts_of_the_submissions_file(tmp_path):
    subs = [dict(s, problem_id=s["contest_id"] + s["index"]) for s in SUBS]
    lt.write_jsonl(tmp_path / "s.jsonl", subs)
    write_verdicts(
        tmp_path / "v.jsonl",
        [
            {"contest_id": 2000, "index": "A", "attempt": 1, "verdict": "WA"},
            {"contest_id": 2000, "index": "A", "attempt": 3, "verdict": "OK"},
            {"contest_id": 2001, "index": "B", "attempt": 1, "verdict": "OK"},
        ],
    )
    contests = {"2000": field_contest("2000", 400), "2001": field_contest("2001", 400)}
    (tmp_path / "c.json").write_text(json.dumps(contests))
    doc = cf.elo_job(
        "base",
        str(tmp_path / "s.jsonl"),
        str(tmp_path / "v.jsonl"),
        str(tmp_path / "c.json"),
        {"min_participants": 200},
    )
    # 2000: A at the third attempt (1 point, penalty 20); 2001: B first time (1 point, penalty 0)
    by = {c["contest_id"]: c for c in doc["contests"]}
    assert (by["2000"]["score"], by["2000"]["penalty"], by["2001"]["penalty"]) == (1.0, 20, 0)
    assert by["2000"]["rank"] > by["2001"]["rank"] and by["2000"]["rating"] < by["2001"]["rating"]
    assert doc["elo"] == (by["2000"]["rating"] + by["2001"]["rating"]) / 2 and doc["status"] == "computed"
    assert (doc["problems"], doc["problems_accepted"]) == (2, 2)


def test_the_report_rows_show_the_elo_or_the_key_to_set_beside_the_papers_number():
    docs = {
        "base": {"elo": 1723.25, "contests_rated": 2, "problems": 9, "status": "computed"},
        "sft": {"elo": None, "problems": 9, "status": "needs the judge's verdicts: set codeforces.verdicts.sft"},
    }
    rows = cf.report_rows(docs)
    assert [(r["policy"], r["codeforces_elo"], r["paper"]) for r in rows] == [
        ("base", 1723.25, 1852),
        ("sft", None, 1815),
    ]
    text = codeforces_sections(docs)[0][1]
    assert "| base | 1723 |" in text and "set codeforces.verdicts.sft" in text
    assert codeforces_sections({}) == []


# --- the DAG and the config -----------------------------------------------------------------------------------------


def report_inputs(stdout):
    return re.search(r"rule promptscale_report:\n\s+input: (.*)", stdout).group(1).split(", ")


def test_without_verdicts_no_elo_job_and_the_report_reads_the_submission_summaries(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    assert load_paper_config("promptscale", "paper")["codeforces"]["verdicts"] == {}
    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    jobs = parse_dry_run(proc.stdout)
    generate = {j.wildcards["policy"]: j.gpus for j in jobs if j.rule == "promptscale_codeforces_generate"}
    assert generate == {"base": 1, "selfplay": 1, "sft": 1}
    assert not [j for j in jobs if j.rule in ("promptscale_codeforces_elo", "promptscale_codeforces_download_contests")]
    assert [j.wildcards["corpus"] for j in jobs if j.rule == "promptscale_download"].count("codeelo") == 1
    cf_inputs = sorted(i.split("/codeforces/")[1] for i in report_inputs(proc.stdout) if "/codeforces/" in i)
    assert cf_inputs == ["base.json", "selfplay.json", "sft.json"]


def test_with_verdicts_the_elo_job_runs_on_cpu_for_that_policy_only(repo_copy):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    (repo_copy / "judge").mkdir()
    (repo_copy / "judge" / "selfplay.jsonl").write_text("")
    path.write_text(text.replace("    verdicts: {}", "    verdicts: {selfplay: judge/selfplay.jsonl}", 1))
    proc = run_snakemake(repo_copy, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    jobs = parse_dry_run(proc.stdout)
    elo = [j for j in jobs if j.rule == "promptscale_codeforces_elo"]
    assert [j.wildcards["policy"] for j in elo] == ["selfplay"] and elo[0].gpus == 0
    contests = [j for j in jobs if j.rule == "promptscale_codeforces_download_contests"]
    assert len(contests) == 1 and contests[0].gpus == 0
    cf_inputs = sorted(i.split("/codeforces/")[1] for i in report_inputs(proc.stdout) if "/codeforces/" in i)
    assert cf_inputs == ["base.json", "selfplay_elo.json", "sft.json"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    attempts: 8 ", "    attempt: 8 "), "attempt"),
        (("    language: cpp ", "    language: pascal "), "pascal"),
        (("    verdicts: {}", "    verdicts: {bse: v.jsonl}"), "bse"),
        (
            ("    corpus: codeelo ", "    corpus: codeforces "),
            "codeforces.corpus = 'codeforces' is not a corpora entry",
        ),
    ],
)
def test_codeforces_config_errors_name_the_key(repo_copy, edit, message):
    from conftest import run_snakemake

    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    if "corpora entry" not in message:  # the schema refuses it when the config loads
        with pytest.raises(ConfigError, match=message):
            load_paper_config("promptscale", "paper", repo_copy)
        return
    proc = run_snakemake(repo_copy, "-n", "--config", "scale=paper", "papers=[promptscale]", check=False)
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr
