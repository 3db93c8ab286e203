"""Long jobs resume: a per-job checkpoint folder outside the job's outputs, and an append-only row journal.

Snakemake deletes an interrupted job's outputs before it reruns the job, so a checkpoint kept among them is lost.
A job that may run for hours therefore keeps its checkpoints here instead:

    with snakemake_job(snakemake) as job:
        folder = job.checkpoint_dir()      # <resources>/checkpoints/<rule>/<key>/, created on demand
        ...                                # train, saving into folder at least every 30 min and resuming from it
    # on a clean exit snakemake_job removes the folder

The key is the sha256 of the job's rule, output paths, params (the `code` param included, so changed library code
starts afresh) and its input files' paths, sizes and modification times (an upstream rerun starts afresh too).
A changed param thus gives another folder: a job never resumes from a checkpoint another configuration made.
`owner.json` in the folder names what the key was made of.

The engines' own resume does the rest (paperflow.core.training: Lightning; paperflow.core.lm.resume: transformers
and TRL). Generation jobs append finished rows to a `RowJournal` and skip them when rerun.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

EVERY_S = 30 * 60  # the longest a job may run between two checkpoints
OWNER = "owner.json"


def _plain(value: Any) -> Any:
    """`value` as JSON-able data with a stable form (Snakemake's Namedlists become lists or dicts)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "items") and callable(value.items) and not isinstance(value, (str, bytes)):
        named = dict(value.items())
        if named:
            return {str(k): _plain(v) for k, v in named.items()}
    if isinstance(value, (list, tuple)) or (hasattr(value, "__iter__") and not isinstance(value, (str, bytes))):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _stamp(path: str) -> list[Any]:
    """What identifies an input file's version without reading it: path, size and modification time."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [path, None, None]
    return [path, st.st_size, st.st_mtime_ns]


def job_identity(job: Any) -> dict[str, Any]:
    """What a checkpoint of `job` belongs to: its rule, outputs, params and input versions."""
    params = {str(k): v for k, v in job.params.items()} if hasattr(job.params, "items") else {}
    return {
        "rule": job.rule,
        "outputs": sorted(str(p) for p in job.output),
        "params": _plain(params),
        "inputs": sorted(_stamp(str(p)) for p in job.input),
    }


def identity_key(identity: Mapping[str, Any]) -> str:
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resources_root(job: Any) -> Path:
    """The run's `resources` folder: the second of the `code` param's generated roots (rules/common.smk)."""
    roots = job.code.get("generated_roots") or ()
    if len(roots) < 2:
        raise ValueError(f"rule {job.rule}: its code param names no resources root (generated_roots: {list(roots)})")
    return Path(roots[1])


def checkpoint_dir(job: Any, root: str | Path | None = None) -> Path:
    """The job's checkpoint folder, <root>/checkpoints/<rule>/<key>/ (root: the run's resources folder), created
    with its owner.json if new."""
    identity = job_identity(job)
    folder = Path(root if root is not None else resources_root(job)) / "checkpoints" / job.rule / identity_key(identity)
    folder.mkdir(parents=True, exist_ok=True)
    owner = folder / OWNER
    if not owner.exists():
        tmp = owner.with_suffix(".tmp")
        tmp.write_text(json.dumps(identity, indent=2, sort_keys=True))
        os.replace(tmp, owner)
    return folder


def remove_checkpoints(folder: str | Path) -> None:
    """Remove a finished job's checkpoint folder (and its rule's folder once empty)."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    with_rule = folder.parent
    if with_rule.is_dir() and not any(with_rule.iterdir()):
        with_rule.rmdir()


class Timer:
    """Says when a checkpoint is due: `every_s` seconds after the last one (or the start)."""

    def __init__(self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        if every_s < 0:
            raise ValueError(f"checkpoint interval must be >= 0 s, got {every_s}")
        self.every_s = every_s
        self.clock = clock
        self.last = clock()

    def elapsed(self) -> float:
        return self.clock() - self.last

    def due(self, ahead_s: float = 0.0) -> bool:
        """Whether a checkpoint is due now, or would be overdue after `ahead_s` more seconds of work."""
        return self.elapsed() + ahead_s >= self.every_s

    def saved(self) -> None:
        self.last = self.clock()


class RowJournal:
    """Finished rows of a generation job, one JSON object per line in an append-only file, keyed by `key`:

        journal = RowJournal(job.checkpoint_dir() / "rows.jsonl", key="id")
        for batch in batched(journal.todo(prompts), 64):
            journal.extend(generate(batch))          # written and fsynced before the next batch starts
        rows = journal.complete([p["id"] for p in prompts])   # every prompt's row, in prompt order

    A rerun reads the rows already there and `todo` leaves their prompts out. A line cut off by a kill (no final
    newline, or not JSON) is dropped and the file truncated to the rows before it. Rows must not depend on which
    other prompts shared their batch (seed each prompt by its id), or a resumed run differs from an uninterrupted
    one.
    """

    def __init__(self, path: str | Path, key: str = "id", sync_every: int = 1) -> None:
        self.path = Path(path)
        self.key = key
        self.sync_every = max(1, int(sync_every))
        self._rows: dict[Any, dict[str, Any]] = {}
        self._unsynced = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._load()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            self._rows[self._id(row)] = row
            good += len(line)
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)

    def _id(self, row: Mapping[str, Any]) -> Any:
        if self.key not in row:
            raise KeyError(f"{self.path}: a row lacks its key {self.key!r}: {sorted(row)}")
        return row[self.key]

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, row_id: Any) -> bool:
        return row_id in self._rows

    def todo(self, items: Iterable[Any], key: Callable[[Any], Any] | None = None) -> list[Any]:
        """The items whose id (`key(item)`, default item[self.key]) has no row yet, in their order."""
        key = key or (lambda item: item[self.key])
        return [item for item in items if key(item) not in self._rows]

    def append(self, row: Mapping[str, Any]) -> None:
        row_id = self._id(row)
        if row_id in self._rows:
            raise ValueError(f"{self.path}: row {row_id!r} is already there")
        self._fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._rows[row_id] = dict(row)
        self._unsynced += 1
        if self._unsynced >= self.sync_every:
            self.sync()

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)
        self.sync()

    def sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._unsynced = 0

    def complete(self, ids: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows of `ids` in that order; refuses while any is missing (the job is not done)."""
        missing = [i for i in ids if i not in self._rows]
        if missing:
            raise ValueError(f"{self.path}: {len(missing)} of {len(ids)} rows missing, e.g. {missing[:3]}")
        return [self._rows[i] for i in ids]

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> RowJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows.values())


@contextlib.contextmanager
def row_journal(path: str | Path | None, key: str = "id") -> Iterator[RowJournal]:
    """A `RowJournal` at `path` (a file in the job's checkpoint folder), or, when `path` is None (a caller run
    outside a Snakemake job, e.g. a test), in a scratch folder that is removed on exit: the rows then live only as
    long as the call, and nothing resumes."""
    if path is not None:
        with RowJournal(path, key=key) as journal:
            yield journal
        return
    with tempfile.TemporaryDirectory() as scratch, RowJournal(Path(scratch) / "rows.jsonl", key=key) as journal:
        yield journal
