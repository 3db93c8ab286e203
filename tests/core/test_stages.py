"""The stage table's derivations (paperflow.core.stages): what a rule gets that its stage does not say."""

from __future__ import annotations

from pathlib import Path

import pytest

from paperflow.core.stages import Stage, StageError, StageTables, derive


def _derive(stage: Stage, tmp_path: Path, config=None):
    (tmp_path / "workflows" / "p" / "scripts").mkdir(parents=True, exist_ok=True)
    (tmp_path / "workflows" / "p" / "scripts" / "train.py").write_text("")
    return derive(
        "p",
        stage,
        config={"seeds": [0, 1], "model": {"d": 2}} if config is None else config,
        path=lambda *parts: "/".join(("results/smoke/p",) + parts),
        code_param=lambda env, script: {"env": env, "script": script},
        env_file=lambda env: f"envs/{env}.yaml",
        root=tmp_path,
    )


def test_a_stage_derives_its_rule_log_benchmark_params_env_and_script(tmp_path):
    stage = Stage(
        "train",
        script="train.py",
        env="gfn",
        resources={"mem_mb": 1},
        output={"model": "m.pt"},
        tag="{env}_{seed}",
        benchmark=True,
        reads=["seeds"],
        params={"lr": 0.1},
    )
    rule = _derive(stage, tmp_path)
    assert rule["rule"] == "p_train"
    assert rule["log"] == "results/smoke/p/logs/train/{env}_{seed}.log"
    assert rule["benchmark"] == "results/smoke/p/benchmarks/train_{env}_{seed}.tsv"
    assert rule["params"] == {
        "seeds": [0, 1],
        "lr": 0.1,
        "code": {"env": "gfn", "script": "workflows/p/scripts/train.py"},
    }
    assert rule["conda"] == "envs/gfn.yaml"
    assert rule["script"] == str(tmp_path / "workflows/p/scripts/train.py")
    assert (rule["output_args"], rule["output"]) == ([], {"model": "m.pt"})


def test_without_a_tag_the_log_is_named_by_the_stage_and_a_log_dir_or_log_overrides(tmp_path):
    base = Stage("report", script="train.py", env="base", resources={}, output="r.md")
    assert _derive(base, tmp_path)["log"] == "results/smoke/p/logs/report.log"
    assert _derive(base, tmp_path)["benchmark"] is None
    assert _derive(base, tmp_path)["output_args"] == ["r.md"]
    moved = Stage(
        "train_text",
        script="train.py",
        env="base",
        resources={},
        output="o",
        tag="{g}",
        log_dir="train",
        benchmark=True,
    )
    assert _derive(moved, tmp_path)["log"] == "results/smoke/p/logs/train/{g}.log"
    assert _derive(moved, tmp_path)["benchmark"] == "results/smoke/p/benchmarks/train_{g}.tsv"
    mixed = Stage("x", script="train.py", env="base", resources={}, output=["m.pt", {"history": "h.csv"}])
    assert (_derive(mixed, tmp_path)["output_args"], _derive(mixed, tmp_path)["output"]) == (
        ["m.pt"],
        {"history": "h.csv"},
    )
    named = Stage("x", script="train.py", env="base", resources={}, output="o", log="x/{a}.txt", benchmark="x.tsv")
    assert _derive(named, tmp_path)["log"] == "results/smoke/p/logs/x/{a}.txt"
    assert _derive(named, tmp_path)["benchmark"] == "results/smoke/p/benchmarks/x.tsv"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"reads": ["nope"]}, "reads ['nope'], not keys of config/p.yaml"),
        ({"reads": ["seeds"], "params": {"seeds": 1}}, "given twice"),
        ({"params": {"code": 1}}, "given twice"),
        ({"script": "absent.py"}, "no script workflows/p/scripts/absent.py"),
    ],
)
def test_a_bad_stage_is_one_line_naming_it(tmp_path, change, words):
    stage = Stage(**{"name": "train", "script": "train.py", "env": "gfn", "resources": {}, "output": "o", **change})
    with pytest.raises(StageError, match=None) as err:
        _derive(stage, tmp_path)
    assert words in str(err.value) and "stage 'train'" in str(err.value) and "\n" not in str(err.value)


def test_a_stage_declared_twice_is_refused(tmp_path):
    tables = StageTables()
    stage = Stage("train", script="train.py", env="gfn", resources={}, output="o")
    kw = {
        "config": {},
        "path": lambda *p: "/".join(p),
        "code_param": lambda e, s: {},
        "env_file": str,
        "root": tmp_path,
    }
    (tmp_path / "workflows" / "p" / "scripts").mkdir(parents=True)
    (tmp_path / "workflows" / "p" / "scripts" / "train.py").write_text("")
    tables.declare("p", [stage], **kw)
    with pytest.raises(StageError, match=r"stages \['train'\] are declared twice"):
        tables.declare("p", [stage], **kw)


def test_a_script_under_rules_scripts_is_a_shared_one_taken_from_the_repository_root(tmp_path):
    (tmp_path / "rules" / "scripts").mkdir(parents=True)
    (tmp_path / "rules" / "scripts" / "download_model.py").write_text("")
    shared = Stage("download_model", script="rules/scripts/download_model.py", env="lm", resources={}, output="m.json")
    rule = _derive(shared, tmp_path)
    assert rule["params"]["code"] == {"env": "lm", "script": "rules/scripts/download_model.py"}
    assert rule["script"] == str(tmp_path / "rules/scripts/download_model.py")
    assert rule["rule"] == "p_download_model" and rule["log"] == "results/smoke/p/logs/download_model.log"
    absent = Stage("x", script="rules/scripts/absent.py", env="lm", resources={}, output="o")
    with pytest.raises(StageError, match="no script rules/scripts/absent.py"):
        _derive(absent, tmp_path)
