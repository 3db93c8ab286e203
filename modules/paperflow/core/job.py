"""The edge between a Snakemake `script:` job and the library.

    from paperflow.core.job import snakemake_job
    with snakemake_job(snakemake) as job:
        ...                        # read job.input / job.params, write job.output
        job.note(seeds=[0, 1, 2])  # anything worth keeping in the provenance record

On entry the job's stdout, stderr and `logging` go to its `log:` file, and the thread count is
applied; on a clean exit a provenance record is written beside every output, and the job's checkpoint
folder (`job.checkpoint_dir()`, see paperflow.core.resume), if it asked for one, is removed. Every rule passes a
`code` param (see rules/common.smk) that names its script, the hash of the library code that script
imports, and its conda env.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paperflow.core.keys import unkey
from paperflow.core.provenance import build_record, utc_now, write_record
from paperflow.core.resume import checkpoint_dir, remove_checkpoints

log = logging.getLogger("paperflow")


@dataclass
class Job:
    """A read-only view of the Snakemake job plus the notes that go into its provenance record."""

    rule: str
    input: Any
    output: Any
    params: Any
    wildcards: Any
    threads: int
    log_file: str | None
    code: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    checkpoints: Path | None = None

    @property
    def paper(self) -> str:
        """The slug of the paper whose workflow holds this rule (from its script, workflows/<slug>/...)."""
        parts = Path(self.code["script"]).parts
        if len(parts) < 2 or parts[0] != "workflows":
            raise ValueError(f"rule {self.rule}: script {self.code['script']} is not under workflows/<slug>/")
        return parts[1]

    @property
    def scale(self) -> str:
        return self.code["scale"]

    def keyed(self, name: str, types: Any = None) -> dict[Any, str]:
        """The inputs of group `name` keyed by label (see paperflow.core.keys)."""
        return unkey(_named(self.input), name, types)

    def checkpoint_dir(self) -> Path:
        """This job's checkpoint folder under the run's resources, outside its outputs (so Snakemake's cleanup of
        an interrupted job leaves it), keyed by its rule, outputs, params and inputs; removed when the job succeeds."""
        if self.checkpoints is None:
            self.checkpoints = checkpoint_dir(self)
        return self.checkpoints

    def note(self, seeds: list[int] | None = None, **values: Any) -> None:
        if seeds is not None:
            self.seeds = list(seeds)
        self.notes.update(values)


def _named(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in obj.items()} if hasattr(obj, "items") else {}


def _files(obj: Any) -> list[str]:
    return [str(p) for p in obj]


def _console_handlers() -> list[logging.StreamHandler]:
    """Stream handlers that libraries attached to the console at import time (Lightning does)."""
    loggers = [logging.getLogger()] + [
        l for l in logging.Logger.manager.loggerDict.values() if isinstance(l, logging.Logger)
    ]
    return [
        h
        for l in loggers
        for h in l.handlers
        if type(h) is logging.StreamHandler and h.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    ]


@contextlib.contextmanager
def _redirected(log_file: str | None) -> Iterator[None]:
    """stdout, stderr and every console logging handler go to the job's log file."""
    if not log_file:
        yield
        return
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", buffering=1) as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        moved = [(h, h.setStream(fh)) for h in _console_handlers()]
        handler = logging.StreamHandler(fh)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            yield
        finally:
            root.removeHandler(handler)
            for h, old_stream in moved:
                h.setStream(old_stream)


@contextlib.contextmanager
def snakemake_job(smk: Any) -> Iterator[Job]:
    code = dict(smk.params.code) if hasattr(smk.params, "code") else {}
    params = {k: v for k, v in _named(smk.params).items() if k != "code"}
    job = Job(
        rule=smk.rule,
        input=smk.input,
        output=smk.output,
        params=smk.params,
        wildcards=smk.wildcards,
        threads=int(smk.threads),
        log_file=str(smk.log[0]) if len(smk.log) else None,
        code=code,
    )
    os.environ.setdefault("WANDB_MODE", "offline")
    started, t0 = utc_now(), time.perf_counter()
    with _redirected(job.log_file):
        _limit_threads(job.threads)
        log.info("rule %s wildcards %s", job.rule, dict(_named(smk.wildcards)))
        yield job
        for out in _files(smk.output):
            if not Path(out).exists():
                raise FileNotFoundError(f"rule {job.rule} finished without writing its output {out}")
        record = build_record(
            temporary=_temporary(smk),
            rule=job.rule,
            wildcards=_named(smk.wildcards),
            params=params | {"code_hash": code.get("hash")},
            inputs=_files(smk.input),
            outputs=_files(smk.output),
            generated_roots=code.get("generated_roots", ()),
            started=started,
            script=code.get("script"),
            conda_env=code.get("env"),
            seeds=job.seeds,
            extra={"notes": job.notes, "wall_s": round(time.perf_counter() - t0, 3), "log": job.log_file},
        )
        write_record(record)
        log.info("wrote provenance for %d output(s) in %.1f s", len(record["outputs"]), record["wall_s"])
        if job.checkpoints is not None:
            remove_checkpoints(job.checkpoints)
            log.info("removed the finished job's checkpoints %s", job.checkpoints)


def _temporary(smk: Any) -> list[str]:
    """The outputs the rule declares temporary in `params.temporary` (the names of its `temp()` outputs: a script
    sees plain paths, without Snakemake's flags), so the provenance record marks them and the audit accepts them
    deleted. A name that is not an output of the rule is refused by name."""
    names = list(getattr(smk.params, "temporary", None) or [])
    outputs = _named(smk.output)
    unknown = [n for n in names if n not in outputs]
    if unknown:
        raise ValueError(
            f"rule {smk.rule}: params.temporary names {unknown}, not outputs of the rule ({sorted(outputs)})"
        )
    return [str(outputs[n]) for n in names]


def _limit_threads(threads: int) -> None:
    """Keep numeric libraries inside the cores Snakemake gave this job."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
