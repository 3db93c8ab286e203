"""Long jobs resume (issue 43): every paper-scale rule whose runtime limit is above an hour checkpoints to its
`job.checkpoint_dir()` and resumes from it, or says in one table below why it does not.

The rules and their limits come from the paper-scale DAG (a dry run, offline), their scripts from the workflow as
Snakemake loads it at paper scale. A script is wired when it, or a module of its own paper that it imports, calls
`checkpoint_dir()` (job.checkpoint_dir(), or a helper of the paper's that does) and hands a folder to one of the
engines of README's "Long jobs resume": Lightning's `make_trainer(checkpoint_dir=...)` or `fit_steps(checkpoint_dir=...)`, transformers/TRL's
`paperflow.core.lm.resume.train`, the plain loop's `LoopCheckpoint` (a numpy loop's `ArrayCheckpoint`), a generation job's `RowJournal` (or `row_journal`), or an official
recipe's own resume switch (verl's `trainer.resume_mode`). A rule that is not wired is in `EXEMPT` (why it needs
no checkpoint) or in `NOT_WIRED` (the ratchet: the issue that wires it and why it is not wired yet); an entry that
no longer matches a long rule, or names a wired one, fails too, so the tables only shrink.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_snakemake

from paperflow.core.codehash import module_closure, module_file
from paperflow.core.plan import parse_dry_run

LIMIT_MIN = 60  # a rule allowed longer than this must resume

# The Hub downloads write into a folder under resources/ (snapshot_download's local_dir, outside the job's outputs):
# huggingface_hub skips the files already there and resumes a file cut off mid-transfer, so a rerun goes on.
HUB_DOWNLOAD = "Hub snapshot_download into a folder under resources/: a rerun skips finished files and resumes cut ones"

EXEMPT: dict[str, str] = {
    "confu_download": HUB_DOWNLOAD,
    "confu_download_model": HUB_DOWNLOAD,
    "doubt_download": HUB_DOWNLOAD,  # the parquet files, then read into the items (seconds)
    "doubt_download_judge": HUB_DOWNLOAD,
    "doubt_download_model": HUB_DOWNLOAD,
    "dualreform_download": HUB_DOWNLOAD + " (then one pass over the shards into the passages table)",
    "dualreform_download_dense": HUB_DOWNLOAD,
    "dualreform_download_model": HUB_DOWNLOAD,
    "eapo_download_model": HUB_DOWNLOAD,
    "enterpriseops_gym_download_model": HUB_DOWNLOAD,
    "itpo_download_model": HUB_DOWNLOAD,
    "itpo_download_simulator": HUB_DOWNLOAD,
    "lozo_plus_download_model": HUB_DOWNLOAD,
    "promptscale_download": HUB_DOWNLOAD,  # then rows of the local snapshot (paperflow.promptscale.paper)
    "promptscale_download_annotator": HUB_DOWNLOAD,
    "promptscale_download_model": HUB_DOWNLOAD,
    "specflow_download_model": HUB_DOWNLOAD,
    "uka_download_judge": HUB_DOWNLOAD,
    "uka_download_model": HUB_DOWNLOAD,
}

NOT_WIRED: dict[str, tuple[int, str]] = {}

# The rule -> (Snakefile, script) map of the workflow as Snakemake loads it at paper scale (a paper's paper.smk
# and synthetic.smk define rules of the same names; only the loaded one counts).
_RULE_SCRIPTS = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(), config_settings=ConfigSettings(config={"scale": "paper"}),
                      storage_settings=StorageSettings(), snakefile=Path("Snakefile"), workdir=Path("."))
    rules = {r.name: [str(r.snakefile), r.script] for r in wf._workflow.rules}
sys.stdout.write("RULES " + json.dumps(rules) + "\\n")
"""


def long_rules(repo: Path) -> dict[str, tuple[str, Path | None]]:
    """Every rule of the paper-scale DAG with a runtime limit above LIMIT_MIN: rule -> (paper, its script)."""
    jobs = parse_dry_run(run_snakemake(repo, "-n", "--config", "scale=paper").stdout)
    limits: dict[str, float] = {}
    for job in jobs:
        limits[job.rule] = max(limits.get(job.rule, 0.0), float(job.resources.get("runtime", 0) or 0))
    proc = subprocess.run([sys.executable, "-c", _RULE_SCRIPTS], cwd=repo, capture_output=True, text=True, check=True)
    scripts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RULES "))[6:])
    out: dict[str, tuple[str, Path | None]] = {}
    for rule, minutes in limits.items():
        if minutes <= LIMIT_MIN:
            continue
        snakefile, script = scripts[rule]
        path = Path(snakefile).parent / script if script else None  # a stage's script is absolute (rules/stages.smk)
        # the paper: the workflows/<paper>/ folder of its script (a stage's rule is defined in rules/stages.smk)
        paper = Path(path or snakefile).resolve().relative_to(repo.resolve()).parts[1]
        out[rule] = (paper, path)
    return out


def _called(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _paper_files(script: Path, paper: str) -> list[Path]:
    """`script` and the modules of `paper`'s own package it imports, or starts by name (`python -m
    paperflow.<paper>.x` under torchrun: a string constant naming the module), transitively."""
    files, todo = [], [script]
    while todo:
        path = todo.pop()
        if path in files:
            continue
        files.append(path)
        todo += [p for name, p in module_closure(path) if name.split(".")[:2] == ["paperflow", paper]]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(f"paperflow.{paper}.")
            ):
                started = module_file(node.value)
                todo += [started] if started is not None and started.suffix == ".py" else []
    return files


def resume_wiring(script: Path, paper: str) -> tuple[bool, set[str]]:
    """(whether `script`, or a module of `paper`'s own that it imports, calls checkpoint_dir(); the resume engines
    they use). The library (paperflow.core) is not read: its job.checkpoint_dir is what a script must call."""
    files = _paper_files(script, paper)
    asks, engines = False, set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = _called(node)
            if name == "checkpoint_dir":
                asks = True
            elif name in ("LoopCheckpoint", "RankCheckpoint", "ArrayCheckpoint"):  # Rank: confu's; Array: numpy loops
                engines.add("loop")
            elif name in ("RowJournal", "row_journal"):
                engines.add("rows")
            elif name in ("make_trainer", "fit_steps") and any(k.arg == "checkpoint_dir" for k in node.keywords):
                engines.add("lightning")
            elif isinstance(node, ast.ImportFrom) and node.module == "paperflow.core.lm.resume":
                engines.add("transformers")
            elif isinstance(node, ast.ImportFrom) and node.module == "paperflow.core.lm":
                engines |= {"transformers" for a in node.names if a.name == "resume"}
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "trainer.resume_mode" in node.value:
                engines.add("verl")
    return asks, engines


def wiring_problems(
    rules: dict[str, tuple[str, Path | None]],
    exempt: dict[str, str],
    not_wired: dict[str, tuple[int, str]],
) -> list[str]:
    """What is wrong with the long rules' resume wiring against the two tables; [] when all is in order."""
    problems = []
    for table, entries in (("EXEMPT", exempt), ("NOT_WIRED", not_wired)):
        for rule in sorted(set(entries) - set(rules)):
            problems.append(f"{rule}: in {table} but no paper-scale rule above {LIMIT_MIN} min: remove the entry")
    for rule in sorted(set(exempt) & set(not_wired)):
        problems.append(f"{rule}: in both EXEMPT and NOT_WIRED")
    for rule, (issue, reason) in sorted(not_wired.items()):
        if not (isinstance(issue, int) and issue > 0 and reason.strip()):
            problems.append(f"{rule}: a NOT_WIRED entry needs an issue number and a reason")
    for rule, reason in sorted(exempt.items()):
        if not reason.strip():
            problems.append(f"{rule}: an EXEMPT entry needs a reason")
    for rule, (paper, script) in sorted(rules.items()):
        asks, engines = resume_wiring(script, paper) if script else (False, set())
        wired = asks and bool(engines)
        if wired and (rule in exempt or rule in not_wired):
            problems.append(f"{rule}: wired ({', '.join(sorted(engines))}): remove it from EXEMPT / NOT_WIRED")
        elif not wired and rule not in exempt and rule not in not_wired:
            what = "never calls checkpoint_dir()" if not asks else "passes its checkpoint folder to no resume engine"
            problems.append(
                f"{rule} ({script}): runtime above {LIMIT_MIN} min but {what}; wire it (README, 'Long jobs resume') "
                "or list it in EXEMPT (why no checkpoint is needed) or NOT_WIRED (issue, reason)"
            )
    return problems


def test_every_long_paper_rule_resumes_or_says_why_not(dry_repo):
    rules = long_rules(dry_repo)
    assert len(rules) > 10, sorted(rules)  # the DAG was read
    problems = wiring_problems(rules, EXEMPT, NOT_WIRED)
    assert not problems, "\n".join(problems)


JOB = "from paperflow.core.job import snakemake_job\n"
WIRED = {
    "lightning": "from paperflow.core.training import fit, make_trainer\n"
    "with snakemake_job(snakemake) as job:\n"
    "    fit(make_trainer(max_epochs=1, checkpoint_dir=job.checkpoint_dir()), None)\n",
    "lightning, a step fit": "from paperflow.core.training import fit_steps\n"
    "with snakemake_job(snakemake) as job:\n"
    "    fit_steps(None, 1, checkpoint_dir=job.checkpoint_dir() / 'fit')\n",
    "loop": "from paperflow.core.loop import LoopCheckpoint, run_loop\n"
    "with snakemake_job(snakemake) as job:\n"
    "    run_loop(None, None, steps=1, checkpoint=LoopCheckpoint(job.checkpoint_dir(), {}))\n",
    "transformers": "from paperflow.core.lm.resume import train\n"
    "with snakemake_job(snakemake) as job:\n"
    "    train(make(output_dir=str(job.checkpoint_dir())))\n",
    "rows": "from paperflow.core.resume import RowJournal\n"
    "with snakemake_job(snakemake) as job:\n"
    "    RowJournal(job.checkpoint_dir() / 'rows.jsonl')\n",
    "rows, scratch-or-folder helper": "from paperflow.core.resume import row_journal\n"
    "with snakemake_job(snakemake) as job:\n"
    "    row_journal(job.checkpoint_dir() / 'rows.jsonl')\n",
}
UNWIRED = {
    "no folder": "from paperflow.core.training import fit, make_trainer\n"
    "with snakemake_job(snakemake) as job:\n"
    "    fit(make_trainer(max_epochs=1), None)\n",
    "folder, no engine": "with snakemake_job(snakemake) as job:\n    folder = job.checkpoint_dir()\n",
    "trainer without the folder": "from paperflow.core.training import fit, make_trainer\n"
    "with snakemake_job(snakemake) as job:\n"
    "    job.checkpoint_dir()\n"
    "    fit(make_trainer(max_epochs=1), None)\n",
}


@pytest.mark.parametrize("engine", sorted(WIRED))
def test_a_wired_script_passes(tmp_path, engine):
    script = tmp_path / "train.py"
    script.write_text(JOB + WIRED[engine])
    assert resume_wiring(script, "nopaper") == (True, {engine.split(",")[0]})  # "rows, ...": a second form of rows
    assert wiring_problems({"x_train": ("nopaper", script)}, {}, {}) == []
    # a wired rule left in a table is named, so the ratchet shrinks
    assert "remove it" in wiring_problems({"x_train": ("nopaper", script)}, {}, {"x_train": (43, "old")})[0]


@pytest.mark.parametrize("case", sorted(UNWIRED))
def test_an_unwired_script_fails_unless_listed(tmp_path, case):
    script = tmp_path / "train.py"
    script.write_text(JOB + UNWIRED[case])
    rules = {"x_train": ("nopaper", script)}
    (problem,) = wiring_problems(rules, {}, {})
    assert problem.startswith("x_train") and "runtime above 60 min" in problem
    assert wiring_problems(rules, {}, {"x_train": (43, "not wired yet")}) == []
    assert wiring_problems(rules, {"x_train": "waits on a server"}, {}) == []
    assert wiring_problems(rules, {}, {"x_train": (0, "")}) != []


def test_a_stale_table_entry_fails(tmp_path):
    assert "remove the entry" in wiring_problems({}, {"gone_train": "x"}, {})[0]
    assert "remove the entry" in wiring_problems({}, {}, {"gone_train": (43, "x")})[0]
