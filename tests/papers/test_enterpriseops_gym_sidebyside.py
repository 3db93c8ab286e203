"""enterpriseops_gym's side by side with the official harness (issue 48; tools/sidebyside/enterpriseops_gym/run.py).

The comparison itself needs a checkout of ServiceNow/EnterpriseOps-Gym at the pinned commit, named by the env var
EOG_OFFICIAL_CHECKOUT (CI has no GitHub access: skipped there, with the reason). The loader's refusals and the
per-episode comparison run without it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from paperflow.enterpriseops_gym import agents as A
from paperflow.enterpriseops_gym import harness, tasks
from paperflow.enterpriseops_gym.sandbox import Template, WorldSize, world_sql

SCRIPT = Path(__file__).parents[2] / "tools/sidebyside/enterpriseops_gym/run.py"


@pytest.fixture(scope="module")
def sbs():
    spec = importlib.util.spec_from_file_location("eog_sidebyside", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---- without the checkout --------------------------------------------------------------------------------------------


def test_the_loader_refuses_another_commit_a_missing_file_and_changed_files_with_one_line(sbs, tmp_path):
    with pytest.raises(sbs.CheckoutError, match="--commit 0123abcd: the side by side is pinned to") as info:
        sbs.load_official(tmp_path, "0123abcd")
    assert "\n" not in str(info.value) and sbs.COMMIT in str(info.value)
    with pytest.raises(sbs.CheckoutError, match=r"benchmark/models.py: missing") as info:
        sbs.load_official(tmp_path, sbs.COMMIT)
    assert "\n" not in str(info.value)
    for rel in sbs.BLOBS:  # every file present, none with the pinned content
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("def get_score(sample):\n    return 0\n")
    with pytest.raises(sbs.CheckoutError, match=r"models.py: git blob [0-9a-f]{8}, 271f2c35 has ec4014cc") as info:
        sbs.load_official(tmp_path, sbs.COMMIT)
    assert "another commit" in str(info.value) and "\n" not in str(info.value)


def test_functions_and_methods_are_taken_by_name_and_a_missing_one_is_refused(sbs, tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("X = 1\n\ndef f(a):\n    return a + X\n\nclass C:\n    def m(self, b):\n        return 2 * b\n")
    got = sbs.take(path, ("f", "C.m"), {"X": 10})
    assert got["f"](1) == 11 and got["C.m"](None, 4) == 8  # f reads the namespace given, not the file's X
    for name in ("g", "C.absent", "f.m"):
        with pytest.raises(sbs.CheckoutError, match=f"mod.py: no '{name}' at the top level") as info:
            sbs.take(path, (name,), {})
        assert "\n" not in str(info.value)


def test_official_shape_and_the_episode_comparison(sbs):
    flat = {"verifier_type": "database_state", "name": "n", "query": "SELECT 1", "expected_value": 1}
    assert sbs.official_shape(flat) == {
        "verifier_type": "database_state",
        "name": "n",
        "gym_name": "eog",
        "validation_config": {"query": "SELECT 1", "expected_value": 1},
    }
    task = {
        "task_id": "t",
        "eog": {"mode": "oracle", "feasible": True},
        "verifiers": [
            {"verifier_type": "database_state", "name": "a"},
            {"verifier_type": "response_check", "name": "b"},
            {"verifier_type": "unchanged", "name": "c"},
        ],
    }
    results = [{"name": "a", "passed": True}, {"name": "b", "passed": True}, {"name": "c", "passed": False}]
    rec = {"errored": None, "overall_success": False, "verification_summary": {"results": results}}
    theirs = {
        "a": {"passed": False, "expected": 1, "actual": 2},
        "b": {"passed": True},
        "c": {"passed": False, "error": "Unsupported verifier type: unchanged"},
    }
    row = sbs.compare_episode(task, "golden", 0, rec, theirs)
    assert (row["ours_shared"], row["official_shared"], row["official"]) == (True, False, False)
    assert [d["name"] for d in row["differing_verifiers"]] == ["a"] and row["unsupported"] == ["c"]
    assert row["shared_verifiers"] == 2 and row["response_checks"] == 1
    table = sbs.agreement([row, {**row, "official_shared": True, "differing_verifiers": []}])
    assert table.loc[0, "agree (shared verifiers)"] == 1 and table.loc[0, "disagree (shared verifiers)"] == 1


# ---- with the checkout -------------------------------------------------------------------------------------------


def checkout() -> Path:
    path = os.environ.get("EOG_OFFICIAL_CHECKOUT")
    if not path or not Path(path).is_dir():
        pytest.skip(
            "EOG_OFFICIAL_CHECKOUT names no checkout of ServiceNow/EnterpriseOps-Gym at 271f2c35 (CI has no GitHub "
            "access; see tools/sidebyside/enterpriseops_gym/run.py for the git archive command)"
        )
    return Path(path)


@pytest.fixture(scope="module")
def official(sbs):
    return sbs.load_official(checkout(), sbs.COMMIT)


@pytest.fixture(scope="module")
def world():
    sql = world_sql(0, WorldSize())
    ts = tasks.build_tasks(sql, 19, 9, 0, ["oracle"])
    return sql, [tasks.load_task(json.loads(json.dumps(r))) for r in ts.modes["oracle"]]


def test_official_verifiers_agree_with_ours_on_every_episode_and_catch_a_planted_difference(sbs, official, world):
    sql, task_list = world
    # a planted verifier where the two comparisons differ: ours compares greater_than as numbers ('5' -> 5.0 > 3),
    # the official code compares the raw values ('5' > 3 raises TypeError: a failed comparison)
    planted = dict(task_list[1])
    planted["task_id"] = planted["task_id"] + "-planted"
    coerced = {
        "verifier_type": "database_state",
        "name": "coerced",
        "query": "SELECT '5' AS v",
        "expected_value": 3,
        "comparison_type": "greater_than",
    }
    planted["verifiers"] = [*task_list[1]["verifiers"], coerced]
    settings = {"random": {"seeds": [0], "max_calls": 10}}
    rows = sbs.verdict_rows(official, [*task_list, planted], sql, ["golden", "noop", "random"], settings)
    assert len(rows) == 3 * (len(task_list) + 1)
    clean = [r for r in rows if not r["task_id"].endswith("-planted")]
    assert all(r["ours_shared"] == r["official_shared"] and not r["differing_verifiers"] for r in clean)
    by = lambda agent: [r for r in clean if r["agent"] == agent]  # noqa: E731
    assert all(r["official_shared"] for r in by("golden"))
    assert not any(r["official_shared"] for r in by("noop") if r["feasible"])
    assert all(r["official_shared"] for r in by("noop") if not r["feasible"])  # the stand-in judge: it declines
    assert sum(r["response_checks"] for r in clean) > 0
    # as shipped: the flat entries do not load, and `unchanged` is unsupported there
    assert all("unexpected keyword argument" in r["as_shipped_error"] for r in rows)
    assert all(r["unsupported"] and not r["official"] for r in by("golden"))
    golden_planted = next(r for r in rows if r["agent"] == "golden" and r["task_id"].endswith("-planted"))
    assert (golden_planted["ours_shared"], golden_planted["official_shared"]) == (True, False)
    (diff,) = golden_planted["differing_verifiers"]
    assert diff["name"] == "coerced" and "Comparison error" in diff["official_detail"]["details"]


def test_compute_score_counts_an_errored_episode_as_a_failure_as_our_metrics_do(sbs, official, world, tmp_path):
    sql, task_list = world
    template = Template(sql)
    local = lambda t: harness.LocalSession(template, t)  # noqa: E731
    golden = [harness.run_episode(t, A.Golden(), local) for t in task_list[:6]]
    golden[0] = {**golden[0], "errored": "endpoint failed after 3 attempt(s)", "overall_success": False}
    noop = [harness.run_episode(t, A.Noop(), local) for t in task_list[:6]]
    table = sbs.scores(official, {"golden": golden, "noop": noop}, tmp_path).set_index("agent")
    assert table.loc["golden", "files with errors"] == 1 and table.loc["golden", "errored episodes (ours)"] == 1
    assert table.loc["golden", "official success %"] == pytest.approx(100 * 5 / 6)
    assert table.loc["golden", "our success %"] == pytest.approx(100 * 5 / 6)
    assert table.loc["noop", "official success %"] == table.loc["noop", "our success %"] == 0
    for agent in ("golden", "noop"):
        assert table.loc[agent, "official verifier pass %"] == pytest.approx(
            table.loc[agent, "our verifier pass % (all tasks)"]
        )
