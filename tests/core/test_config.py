"""Config loading and validation: every error names the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import copy_repo, run_snakemake

from paperflow.core.config import (
    ConfigError,
    RunConfig,
    available_papers,
    deep_merge,
    load_paper_config,
    load_run_config,
    summarised_papers,
)

GOOD = {
    "scale": "smoke",
    "papers": ["ph_vae"],
    "results": "results",
    "resources": "resources",
    "wandb": {"enabled": False, "mode": "offline", "project": "paperflow"},
}


def edit_yaml(path: Path, fn) -> None:
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_deep_merge_overrides_leaves_and_keeps_siblings():
    base = {"a": {"x": 1, "y": 2}, "b": [1, 2]}
    assert deep_merge(base, {"a": {"y": 3}, "b": [9]}) == {"a": {"x": 1, "y": 3}, "b": [9]}
    assert base == {"a": {"x": 1, "y": 2}, "b": [1, 2]}


def test_repository_config_resolves_at_every_scale(repo_root):
    for scale in ("tiny", "smoke", "paper"):
        run = load_run_config(GOOD | {"scale": scale}, repo_root)
        cfg = run.paper_configs["ph_vae"]
        assert set(cfg["run_datasets"]) <= set(cfg["datasets"])
    assert load_paper_config("ph_vae", "tiny", repo_root)["train"]["epochs"] == 2  # tiny block wins
    assert load_paper_config("ph_vae", "smoke", repo_root)["train"]["epochs"] == 15  # defaults


def test_unknown_paper_slug_lists_available(repo_root):
    with pytest.raises(
        ConfigError, match=r"unknown paper 'ph_vea' \(did you mean 'ph_vae'\?\); available papers: .*ph_vae"
    ):
        load_run_config(GOOD | {"papers": ["ph_vea"]}, repo_root)


def test_papers_all_composes_every_workflow(repo_root):
    run = load_run_config(GOOD | {"papers": "all"}, repo_root)
    on_disk = sorted(p.parent.name for p in (repo_root / "workflows").glob("*/Snakefile"))
    assert list(run.papers) == on_disk and "ph_vae" in on_disk
    with pytest.raises(ConfigError, match="papers"):
        load_run_config(GOOD | {"papers": "everything"}, repo_root)


def test_unknown_scale_lists_allowed(repo_root):
    with pytest.raises(
        ConfigError, match=r"scale = 'huge' is not allowed; allowed values: 'tiny', 'smoke', 'cpu', 'paper'"
    ):
        load_run_config(GOOD | {"scale": "huge"}, repo_root)


def test_unknown_global_key(repo_root):
    with pytest.raises(ConfigError, match=r"unknown key 'scael' \(did you mean 'scale'\?\)"):
        load_run_config(GOOD | {"scael": "tiny"}, repo_root)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["smoke"].update(train={"lrr": 0.1}),
            r"config/ph_vae.yaml: unknown key 'smoke.train.lrr' \(did you mean 'lr'\?\); allowed keys here: batch_size, devices, epochs, grad_clip, lr, weight_decay",
        ),
        (
            lambda d: d["defaults"]["train"].update(epochs="ten"),
            r"defaults.train.epochs = 'ten' has the wrong type; expected integer",
        ),
        (lambda d: d["smoke"].update(train={"lr": -0.1}), r"smoke.train.lr = -0.1 is out of range; must be > 0"),
        (
            lambda d: d["defaults"]["model"].update(likelihood="pade"),
            r"defaults.model.likelihood = 'pade' is not allowed; allowed values: 'expm', 'uniformisation'",
        ),
        (
            lambda d: d["smoke"].update(decoders=["ph", "gaus"]),
            r"smoke.decoders\[1\] = 'gaus' is not allowed; allowed values: 'gauss', 'student_t', 'gev', 'ph'",
        ),
        (
            lambda d: d["smoke"].update(run_datasets=["pareto1d", "pareto2d"]),
            r"run_datasets\[...\] = 'pareto2d' is not allowed \(did you mean 'pareto1d'\?\)",
        ),
        (lambda d: d.update(smok={}), r"unknown top-level key 'smok' \(did you mean 'smoke'\?\)"),
        (lambda d: d["defaults"].pop("seeds"), r"missing key\(s\) 'seeds'"),
    ],
    ids=["misspelt-key", "wrong-type", "out-of-range", "enum", "list-item", "cross-reference", "top-level", "missing"],
)
def test_paper_config_errors_name_key_and_allowed(repo_copy, edit, message):
    edit_yaml(repo_copy / "config" / "ph_vae.yaml", edit)
    with pytest.raises(ConfigError, match=message):
        load_paper_config("ph_vae", "smoke", repo_copy)


def test_bad_config_fails_in_snakemake_before_any_job(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    edit_yaml(repo / "config" / "ph_vae.yaml", lambda d: d["smoke"].update(train={"epocs": 3}))
    proc = run_snakemake(repo, "--cores", "1", check=False)
    assert proc.returncode != 0
    assert "unknown key 'smoke.train.epocs' (did you mean 'epochs'?)" in proc.stderr + proc.stdout
    assert not (repo / "results").exists()
    proc = run_snakemake(repo, "-n", "--config", "scale=big", check=False)
    assert proc.returncode != 0 and "scale = 'big' is not allowed" in proc.stderr + proc.stdout


def test_a_missing_global_key_is_named(repo_root):
    """config/config.yaml is the one source of the global defaults: the code has no second one."""
    with pytest.raises(ConfigError, match="results"):
        load_run_config({k: v for k, v in GOOD.items() if k != "results"}, repo_root)
    with pytest.raises(ConfigError) as err:  # several missing keys: one line, not one copy per key
        load_run_config({"scale": "smoke"}, repo_root)
    assert str(err.value).count("missing key(s)") == 1
    assert "'papers', 'results', 'resources', 'wandb'" in str(err.value)


def test_require_choices_names_the_key_the_unknown_entry_and_what_is_missing():
    from paperflow.core.config import require_choices

    require_choices(["a", "b"], source="cfg", key="methods", known=["a", "b", "c"], required=["a"])
    with pytest.raises(
        ConfigError, match=r"cfg: methods: unknown method 'bb' \(did you mean 'b'\?\); choose from a, b, c"
    ):
        require_choices(["a", "bb"], source="cfg", key="methods", known=["a", "b", "c"], noun="method")
    with pytest.raises(
        ConfigError, match=r"cfg: agents lacks \['c'\], which S1 compares; it must include \['a', 'c'\]"
    ):
        require_choices(["a", "b"], source="cfg", key="agents", required=["a", "c"], why="S1 compares")


def test_the_summary_covers_the_enabled_papers_and_every_other_with_results(repo_root, tmp_path, monkeypatch):
    """A run narrowed to ph_vae summarises dro_flow too where dro_flow has results at that scale (issue 56)."""
    monkeypatch.chdir(tmp_path)
    run = RunConfig("tiny", ("ph_vae",), "results", "resources", {}, {})
    assert summarised_papers(run, repo_root) == ["ph_vae"]
    for slug, scale in (("dro_flow", "tiny"), ("spaef", "smoke")):
        (tmp_path / "results" / scale / slug).mkdir(parents=True)
        (tmp_path / "results" / scale / slug / "metrics.json").write_text("{}")
    assert summarised_papers(run, repo_root) == ["dro_flow", "ph_vae"]
    every = available_papers(repo_root)
    assert summarised_papers(RunConfig("tiny", tuple(every), "results", "resources", {}, {}), repo_root) == every


def test_resolved_configs_are_kept_and_reused_until_an_input_changes(repo_copy, monkeypatch):
    from paperflow.core import config as config_mod

    first = load_run_config(GOOD, repo_copy)
    kept = list((repo_copy / ".snakemake" / "paperflow" / "resolved").glob("*.pickle"))
    assert len(kept) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("the kept configs should have been used")

    monkeypatch.setattr(config_mod, "load_paper_config", refuse)
    assert load_run_config(GOOD, repo_copy).paper_configs == first.paper_configs
    monkeypatch.undo()

    # an edit to the paper's config is a new key: resolved (and validated) again, and a bad value still fails
    edit_yaml(repo_copy / "config" / "ph_vae.yaml", lambda d: d["smoke"].setdefault("train", {}).update(epochs=3))
    assert load_run_config(GOOD, repo_copy).paper_configs["ph_vae"]["train"]["epochs"] == 3
    edit_yaml(repo_copy / "config" / "ph_vae.yaml", lambda d: d["smoke"]["train"].update(epochs="many"))
    with pytest.raises(ConfigError, match=r"epochs = 'many' has the wrong type"):
        load_run_config(GOOD, repo_copy)


def test_the_key_of_kept_configs_covers_schemas_and_the_settings_code(repo_copy, monkeypatch):
    from paperflow.core import codehash
    from paperflow.core import config as config_mod

    key = config_mod._resolved_key(["ph_vae"], "smoke", repo_copy)
    assert key == config_mod._resolved_key(["ph_vae"], "smoke", repo_copy)
    assert key != config_mod._resolved_key(["ph_vae"], "tiny", repo_copy)
    assert key != config_mod._resolved_key(["ph_vae", "spaef"], "smoke", repo_copy)
    claims_schema = repo_copy / "config" / "schemas" / "claims.schema.yaml"
    claims_schema.write_text(claims_schema.read_text() + "\n# an edit\n")
    edited = config_mod._resolved_key(["ph_vae"], "smoke", repo_copy)
    assert edited != key
    # a change in the code that checks configs (a module the settings import) is a new key
    monkeypatch.setattr(codehash, "code_hash", lambda path: "another closure")
    assert config_mod._resolved_key(["ph_vae"], "smoke", repo_copy) != edited
