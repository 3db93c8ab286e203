"""promptscale's code-domain seeds at paper scale, offline: open-r1/codeforces statements read from a fake Hub
snapshot in its layout and columns (only the configured split fetched, at the pinned commit), statements assembled
and interactive / empty / repeated ones dropped and counted; the annotators' answers parsed (malformed ones dropped
by reason); an annotate job end to end against the shared fake OpenAI server; the per-domain split with domain
tags and no train / held-out leakage; synthesis carrying the seed's domain; the paper-scale DAG with one annotate job
per annotator on its GPUs feeding the preprocess; config errors by name."""

from __future__ import annotations

import re

import pytest
import test_promptscale_paper as base
from fake_openai import FakeOpenAI

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.promptscale import annotate as ann
from paperflow.promptscale import llm_text as lt
from paperflow.promptscale import paper, paper_generate

FakeVLLM, vllm_cfg = base.FakeVLLM, base.vllm_cfg
hub, cfg, tiny_model_folder = base.hub, base.cfg, base.tiny_model_folder  # the fixtures of the paper-scale tests


def test_statements_are_assembled_from_the_configured_split_and_unusable_ones_dropped(hub, cfg, tmp_path):
    spec = cfg["corpora"]["codeforces"]
    assert spec["format"] == "codeforces_statements" and re.fullmatch(r"[0-9a-f]{40}", spec["revision"])
    info = paper.download_corpus("codeforces", spec, str(tmp_path / "cache"), str(tmp_path / "cf.jsonl"))
    assert hub[0]["written"] == ["data/train-00000-of-00001.parquet"]  # the test split is not fetched
    assert hub[0]["revision"] == spec["revision"]
    assert {k: info[k] for k in ("records", "kept", "interactive", "no_description", "duplicate_id")} == {
        "records": 5,
        "kept": 2,
        "interactive": 1,
        "no_description": 1,
        "duplicate_id": 1,
    }
    rows = lt.read_jsonl(tmp_path / "cf.jsonl")
    assert [r["id"] for r in rows] == ["1/A", "1/D"]
    assert rows[0]["problem"] == (
        "A. Sum\n\nAdd two numbers.\n\nInput\nTwo integers a and b.\n\nOutput\nTheir sum.\n\n"
        "Example 1\nInput:\n1 2\nOutput:\n3\n\nNote\n1+2=3."
    )
    assert (rows[0]["rating"], rows[0]["difficulty"], rows[0]["tags"]) == (800, "Codeforces 800", ["math"])
    assert (rows[1]["rating"], rows[1]["difficulty"]) == (None, "Codeforces")  # no rating: the bare level
    assert rows[1]["tags"] == ["greedy", "implementation"] and "Example" not in rows[1]["problem"]


def test_a_corpus_without_the_statement_columns_is_refused_naming_them(tmp_path):
    import pandas as pd

    pd.DataFrame({"id": ["1/A"], "prompt": ["x"]}).to_parquet(tmp_path / "train.parquet")
    with pytest.raises(ValueError, match=r"no column \['description'\]"):
        ann.read_statement_records(tmp_path, ["*.parquet"])


SETTINGS = {"min_concepts": 2, "max_concepts": 3}
C0, C1 = ann.CONCEPTS
R0, R1 = lt.RATIONALE


@pytest.mark.parametrize(
    ("text", "finish", "expected"),
    [
        (
            f"Sure.\n{C0}\n1. Prefix sums\n2) Binary search.\n- greedy choice\n{C1}\n",
            "stop",
            (["Prefix sums", "Binary search", "greedy choice"], "ok"),
        ),
        (f"{C0}\n1. Graphs\n2. graphs\n3. BFS\n4. DFS\n5. Trees\n{C1}", "stop", (["Graphs", "BFS", "DFS"], "ok")),
        (f"{C0}\nno list here\n1. Only one\n{C1}", "stop", (None, "too_few_concepts")),
        ("1. Graphs\n2. BFS", "stop", (None, "concepts_unmarked")),
        (f"{C0}\n1. Graphs\n2. BFS\n3. DF", "length", (None, "concepts_truncated")),
        (f"{C1}\n1. a\n2. b\n{C0}", "stop", (None, "concepts_unmarked")),
    ],
)
def test_concepts_are_parsed_from_the_marked_list_and_malformed_answers_named(text, finish, expected):
    assert ann.parse_concepts(text, finish, SETTINGS) == expected


@pytest.mark.parametrize(
    ("text", "finish", "expected"),
    [
        (f"Plan:\n{R0}\n Start from BFS, add a twist. \n{R1} trailing", "stop", ("Start from BFS, add a twist.", "ok")),
        (f"{R0}\nStart from BFS and", "length", (None, "rationale_truncated")),
        ("Start from BFS.", "stop", (None, "rationale_unmarked")),
        (f"{R0}\n  \n{R1}", "stop", (None, "rationale_empty")),
    ],
)
def test_rationales_are_parsed_from_the_marked_span_and_malformed_answers_named(text, finish, expected):
    assert ann.parse_rationale(text, finish) == expected


def annotators(*names, gpus=1):
    return {n: {"hub": f"org/{n}", "dtype": "bfloat16", "gpus": gpus, "max_model_len": 4096, "share": 1} for n in names}


def test_each_statement_goes_to_one_annotator_by_its_id_whatever_the_order():
    rows = [{"id": f"{c}/{i}", "problem": "p"} for c in range(400) for i in "AB"]
    settings = {"seed": 0, "max_statements": None, "annotators": annotators("a", "b", "c", "d")}
    shares = ann.assign(rows, settings)
    ids = {n: [r["id"] for r in s] for n, s in shares.items()}
    assert sorted(i for s in ids.values() for i in s) == sorted(r["id"] for r in rows)  # a partition
    assert all(150 < len(s) < 250 for s in ids.values()), {n: len(s) for n, s in ids.items()}  # about 800 / 4 each
    again = ann.assign(rows[::-1], settings)
    assert {n: sorted(r["id"] for r in s) for n, s in again.items()} == {n: sorted(s) for n, s in ids.items()}
    other = ann.assign(rows, {**settings, "seed": 1})
    assert {n: [r["id"] for r in s] for n, s in other.items()} != ids  # the seed salts the hash
    weighted = ann.assign(rows, {**settings, "annotators": {**annotators("a", "b"), "a": {"share": 3}}})
    assert 550 < len(weighted["a"]) < 650  # share 3 : 1
    subset = ann.assign(rows, {**settings, "max_statements": 100})
    assert sum(len(s) for s in subset.values()) == 100
    assert ann.assign(rows[::-1], {**settings, "max_statements": 100}).keys() == subset.keys()
    assert {r["id"] for s in ann.assign(rows[::-1], {**settings, "max_statements": 100}).values() for r in s} == {
        r["id"] for s in subset.values() for r in s
    }


def statement_rows():
    return [
        {
            "id": f"9/{c}",
            "contest_id": "9",
            "index": c,
            "rating": 1200,
            "tags": ["dp"],
            "difficulty": "Codeforces 1200",
            "problem": f"Problem {c}: count the paths.",
        }
        for c in "ABCDEFG"
    ]


def scripted(path, body):
    """The fake annotator: request 1 answers per problem letter (A, F, G well formed, B unmarked, C one concept, D
    cut at max_tokens), request 2 (only for A, E, F, G) a marked rationale except E (cut) and G (empty)."""
    assert path.endswith("/chat/completions") and len(body["messages"]) == 1, path
    text = body["messages"][0]["content"]
    letter = re.search(r"Problem ([A-G]):", text).group(1)
    finish = "stop"
    if text.startswith("You are an expert competitive programmer"):
        answer = {
            "B": "1. DP\n2. Paths",
            "C": f"{C0}\n1. DP\n{C1}",
            "D": f"{C0}\n1. DP\n2. Pa",
        }.get(letter, f"{C0}\n1. Dynamic programming on grids\n2. Counting paths {letter}\n{C1}")
        finish = "length" if letter == "D" else "stop"
    else:
        assert "1. Dynamic programming on grids" in text and "Difficulty Level: Codeforces 1200" in text
        answer = {"E": f"{R0}\nFirst pick", "G": f"{R0}\n{R1}"}.get(letter, f"{R0}\nPlan for {letter}.\n{R1}")
        finish = "length" if letter == "E" else "stop"
    return [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": finish}]


def test_an_annotate_job_asks_concepts_then_rationales_and_keeps_the_well_formed_triples(tmp_path):
    lt.write_jsonl(tmp_path / "statements.jsonl", statement_rows())
    settings = {
        "seed": 7,
        "max_statements": None,
        "min_concepts": 2,
        "max_concepts": 5,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_concept_tokens": 100,
        "max_rationale_tokens": 200,
        "annotators": annotators("qwen32b", gpus=2),
    }
    with FakeOpenAI(scripted, name="qwen32b") as server:
        summary = ann.annotate(
            "qwen32b",
            str(tmp_path),
            str(tmp_path / "statements.jsonl"),
            settings,
            vllm_cfg(server.url.removesuffix("/v1")),
            str(tmp_path / "t.jsonl"),
            str(tmp_path / "t.json"),
            str(tmp_path / "vllm.log"),
        )
        bodies = list(server.bodies)
    assert summary["share"] == 7 and summary["kept"] == 2
    assert summary["dropped"] == {
        "concepts_unmarked": 1,
        "concepts_truncated": 1,
        "too_few_concepts": 1,
        "rationale_unmarked": 0,
        "rationale_truncated": 1,
        "rationale_empty": 1,
    }
    assert len(bodies) == 7 + 4  # every statement once, then only those whose concepts parsed
    assert [b["max_tokens"] for b in bodies] == [100] * 7 + [200] * 4
    assert {b["temperature"] for b in bodies} == {0.0}
    assert sorted(b["seed"] for b in bodies[:7]) == list(range(7, 14))  # seed + request index
    kept = lt.read_jsonl(tmp_path / "t.jsonl")
    assert [r["id"] for r in kept] == ["9/A", "9/F"]
    assert kept[1] == {
        "concepts": ["Dynamic programming on grids", "Counting paths F"],
        "difficulty": "Codeforces 1200",
        "rationale": "Plan for F.",
        "problem": "Problem F: count the paths.",
        "domain": "code",
        "annotator": "qwen32b",
        "id": "9/F",
        "rating": 1200,
        "tags": ["dp"],
    }
    assert ann.job_vllm(vllm_cfg(None), settings["annotators"]["qwen32b"])["tensor_parallel_size"] == 2
    # two annotators: this one asks only for its share
    two = {**settings, "annotators": annotators("qwen32b", "phi4")}
    share = [r["id"] for r in ann.assign(statement_rows(), two)["phi4"]]
    with FakeOpenAI(scripted, name="phi4") as server:
        summary = ann.annotate(
            "phi4",
            str(tmp_path),
            str(tmp_path / "statements.jsonl"),
            two,
            vllm_cfg(server.url.removesuffix("/v1")),
            str(tmp_path / "p.jsonl"),
            str(tmp_path / "p.json"),
            str(tmp_path / "vllm.log"),
        )
        asked = {re.search(r"Problem ([A-G]):", b["messages"][0]["content"]).group(1) for b in server.bodies}
    assert 0 < len(share) < 7 and summary["share"] == len(share)
    assert asked == {i[-1] for i in share}


def math_and_code(tmp_path, n_math=12, n_code=(5, 4)):
    math = [
        {"concepts": ["sums", f"m{i}"], "difficulty": "AMC12", "rationale": "r", "problem": f"Math {i}."}
        for i in range(n_math)
    ] + [{"concepts": ["x"], "difficulty": "AMC12", "rationale": "r", "problem": "Math 0."}]
    lt.write_jsonl(tmp_path / "seeds.jsonl", math)
    paths, k = [], 0
    for j, n in enumerate(n_code):
        rows = []
        for _ in range(n):
            rows.append(
                {
                    "concepts": ["graphs", f"c{k}"],
                    "difficulty": "Codeforces 1500",
                    "rationale": "z",
                    "problem": f"Code {k}.",
                    "domain": "code",
                    "annotator": f"a{j}",
                    "id": f"{k}/A",
                }
            )
            k += 1
        rows.append({**rows[0], "annotator": "dup"})  # the same problem from another annotator: dropped
        lt.write_jsonl(tmp_path / f"a{j}.jsonl", rows)
        paths.append(str(tmp_path / f"a{j}.jsonl"))
    return paths


def test_preprocess_splits_each_domain_tags_every_row_and_leaves_the_math_rows_as_a_math_only_run(tmp_path):
    code = math_and_code(tmp_path)
    settings = {
        "n_train": 100,
        "n_heldout": 3,
        "seed": 0,
        "domains": ["math", "code"],
        "code": {"n_train": None, "n_heldout": 2},
    }
    counts = paper.preprocess(
        str(tmp_path / "seeds.jsonl"), settings, str(tmp_path / "tr.jsonl"), str(tmp_path / "ho.jsonl"), code
    )
    assert counts == {
        "seeds": 13,
        "distinct": 12,
        "train": 9,
        "heldout": 3,
        "code_seeds": 11,
        "code_distinct": 9,
        "code_train": 7,
        "code_heldout": 2,
    }
    train, heldout = lt.read_jsonl(tmp_path / "tr.jsonl"), lt.read_jsonl(tmp_path / "ho.jsonl")
    assert [r["domain"] for r in heldout] == ["math"] * 3 + ["code"] * 2
    assert [r["domain"] for r in train] == ["math"] * 9 + ["code"] * 7
    assert all(r["problem"].startswith("Math" if r["domain"] == "math" else "Code") for r in train + heldout)
    assert not {r["problem"] for r in train} & {r["problem"] for r in heldout}  # no leakage
    assert len({r["problem"] for r in train + heldout}) == 21  # nothing lost but the duplicates
    # math only (the switch): the same math rows, no code row, the counts of before
    only = paper.preprocess(
        str(tmp_path / "seeds.jsonl"),
        {"n_train": 100, "n_heldout": 3, "seed": 0},
        str(tmp_path / "tr1.jsonl"),
        str(tmp_path / "ho1.jsonl"),
        code,
    )
    assert only == {"seeds": 13, "distinct": 12, "train": 9, "heldout": 3}
    assert lt.read_jsonl(tmp_path / "tr1.jsonl") == train[:9]
    assert lt.read_jsonl(tmp_path / "ho1.jsonl") == heldout[:3]
    code_train = paper.preprocess(
        str(tmp_path / "seeds.jsonl"),
        {**settings, "code": {"n_train": 3, "n_heldout": 2}},
        str(tmp_path / "tr2.jsonl"),
        str(tmp_path / "ho2.jsonl"),
        code,
    )
    assert code_train["code_train"] == 3
    with pytest.raises(ValueError, match=r"seeds_data\.code\.n_heldout = 9"):
        paper.preprocess(
            str(tmp_path / "seeds.jsonl"),
            {**settings, "code": {"n_train": None, "n_heldout": 9}},
            str(tmp_path / "tr3.jsonl"),
            str(tmp_path / "ho3.jsonl"),
            code,
        )


def test_synthesis_tags_each_problem_with_the_domain_of_its_concept_set(tmp_path, cfg):
    code = math_and_code(tmp_path, n_math=8, n_code=(6,))
    settings = {
        "n_train": 100,
        "n_heldout": 4,
        "seed": 0,
        "domains": ["math", "code"],
        "code": {"n_train": None, "n_heldout": 4},
    }
    paper.preprocess(
        str(tmp_path / "seeds.jsonl"), settings, str(tmp_path / "tr.jsonl"), str(tmp_path / "ho.jsonl"), code
    )
    heldout = lt.read_jsonl(tmp_path / "ho.jsonl")
    domain_of = {tuple(r["concepts"]): r["domain"] for r in heldout}
    fake = FakeVLLM("p_em")
    try:
        summary = paper_generate.synthesize(
            str(tmp_path),
            str(tmp_path / "ho.jsonl"),
            "em",
            {**cfg["llm_synthesis"], "n": 40},
            vllm_cfg(fake.url),
            "bfloat16",
            str(tmp_path / "synth.jsonl"),
            str(tmp_path / "vllm.log"),
        )
        prompts = [b["prompt"] for b in sorted(fake.bodies, key=lambda b: b["seed"])]
    finally:
        fake.close()
    rows = lt.read_jsonl(tmp_path / "synth.jsonl")
    assert [r["domain"] for r in rows] == [domain_of[tuple(r["concepts"])] for r in rows]
    assert {r["domain"] for r in rows} == {"math", "code"}
    assert all(p == lt.p_prompt(r["concepts"], r["difficulty"]) for p, r in zip(prompts, rows))
    assert all(("Codeforces" in r["difficulty"]) == (r["domain"] == "code") for r in rows)
    by = summary["by_domain"]
    assert by["math"]["n"] + by["code"]["n"] == 40
    assert by["math"]["n"] == sum(r["domain"] == "math" for r in rows)
    # without a domain on the seeds (a math-only split of before): the same draws, all math
    plain = [{k: v for k, v in r.items() if k != "domain"} for r in heldout]
    sets = paper_generate.concept_sets(plain, 40, 0)
    assert [s["concepts"] for s in sets] == [r["concepts"] for r in rows] and {s["domain"] for s in sets} == {"math"}


def test_the_paper_dag_has_one_annotate_job_per_annotator_on_its_gpus_feeding_the_preprocess(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    config = load_paper_config("promptscale", "paper")
    assert config["seeds_data"]["domains"] == ["math", "code"]
    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    jobs = parse_dry_run(proc.stdout)
    annotate = {j.wildcards["annotator"]: j.gpus for j in jobs if j.rule == "promptscale_annotate"}
    assert annotate == {n: a["gpus"] for n, a in config["annotate"]["annotators"].items()}
    assert annotate == {"qwen32b": 2, "qwen72b": 4, "llama70b": 4, "phi4": 1}
    downloads = [j for j in jobs if j.rule == "promptscale_download_annotator"]
    assert sorted(j.wildcards["annotator"] for j in downloads) == sorted(annotate)
    assert {j.gpus for j in downloads} == {0}
    assert [j.wildcards for j in jobs if j.rule == "promptscale_download" and j.wildcards["corpus"] == "codeforces"]
    inputs = re.search(r"rule promptscale_preprocess:\n\s+input: (.*)", proc.stdout).group(1).split(", ")
    assert sorted(i.rsplit("/", 1)[-1] for i in inputs if "/annotate/" in i) == sorted(f"{a}.jsonl" for a in annotate)


def test_with_math_only_no_code_seed_job_is_planned(repo_copy):
    from conftest import run_snakemake

    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    assert "    domains: [math, code]" in text
    path.write_text(text.replace("    domains: [math, code]", "    domains: [math]"))
    proc = run_snakemake(repo_copy, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    counts = dict(re.findall(r"^(promptscale_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert "promptscale_annotate" not in counts and "promptscale_download_annotator" not in counts
    assert "corpus=codeforces" not in proc.stdout and counts["promptscale_preprocess"] == "1"  # (the Elo's jobs stay)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    max_concept_tokens: 1024\n", "    max_concept_token: 1024\n"), "max_concept_token"),
        (("        max_model_len: 16384", "        max_model_length: 16384"), "max_model_length"),
        (("    domains: [math, code]", "    domains: [math, cobol]"), "cobol"),
        (("    code: {n_train: null, n_heldout: 500}", "    code: {n_train: null, n_held: 500}"), "n_held"),
        (("      format: codeforces_statements", "      format: codeforces_statement"), "codeforces_statement"),
        (("        gpus: 4\n", "        gpus: 0\n"), "gpus"),
    ],
)
def test_config_errors_in_the_code_seed_keys_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("promptscale", "paper", repo_copy)


def test_cross_key_rules_of_the_code_seeds_are_refused_by_name(cfg):
    ann.check_settings(cfg, "cfg")  # the shipped config passes
    with pytest.raises(ConfigError, match="annotate.corpus = 'seeds'"):
        ann.check_settings({**cfg, "annotate": {**cfg["annotate"], "corpus": "seeds"}}, "cfg")
    with pytest.raises(ConfigError, match="min_concepts exceeds"):
        ann.check_settings({**cfg, "annotate": {**cfg["annotate"], "min_concepts": 9}}, "cfg")
    without = {k: v for k, v in cfg.items() if k != "annotate"}
    with pytest.raises(ConfigError, match="no annotate block"):
        ann.check_settings(without, "cfg")
    ann.check_settings({**without, "seeds_data": {**cfg["seeds_data"], "domains": ["math"]}}, "cfg")  # math only


def test_an_unpinned_annotator_is_refused_naming_its_annotate_key(tmp_path, monkeypatch):
    from paperflow.core.download import PIN_ENV, UnpinnedDownload
    from paperflow.core.hub_download import download_model

    monkeypatch.delenv(PIN_ENV, raising=False)
    monkeypatch.setattr("paperflow.core.download.lock_path", lambda slug, root=None: tmp_path / "none.json")
    spec = {"hub": "org/annotator-x", "repo_type": "model", "revision": None, "files": ["*.json"]}
    with pytest.raises(UnpinnedDownload, match=r"annotate\.annotators\.x\.revision .*`paperflow pin promptscale`"):
        download_model(
            spec,
            slug="promptscale",
            key="annotate.annotators.x.revision",
            cache=str(tmp_path / "c"),
            out=str(tmp_path / "a.json"),
            extra={"role": "annotator_x"},
        )
    assert not (tmp_path / "a.json").exists()
