"""Keyed stage inputs: a rule that gathers many files of one kind (a checkpoint per method and seed)
names each input by its labels, so the script looks files up by label and never by position.

    # Snakefile                                     # script / library
    input: unpack(lambda wc: keyed("ckpt", {        ckpts = unkey(job.input, "ckpt", types=(str, int))
        (m, s): path(m, s) for m in M for s in S})) ckpts[("ph", 0)] -> ".../ph/seed0.ckpt"

Reordering the methods or seeds in a config then reorders the inputs but cannot change which file a
label reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

SEP = "__"


def _parts(label: Any) -> tuple[Any, ...]:
    return label if isinstance(label, tuple) else (label,)


def key(name: str, label: Any) -> str:
    """The input name of `label` (a value or a tuple of values) in the group `name`."""
    parts = [str(p) for p in _parts(label)]
    for part in [name, *parts]:
        if SEP in part or not part:
            raise ValueError(f"input label part {part!r} is empty or contains {SEP!r}")
    return SEP.join([name, *parts])


def keyed(name: str, files: Mapping[Any, str]) -> dict[str, str]:
    """Named inputs for `unpack()`: one per label of `files`."""
    return {key(name, label): path for label, path in files.items()}


def unkey(
    named: Any, name: str, types: Sequence[Callable[[str], Any]] | None = None
) -> dict[tuple[Any, ...] | Any, str]:
    """The files of group `name` among a job's named inputs, keyed by their labels; `types` converts
    each label part (e.g. `(str, int)` for (method, seed)). A one-part label is returned bare."""
    items = named.items() if hasattr(named, "items") else named
    prefix = name + SEP
    out: dict[Any, str] = {}
    for input_name, path in items:
        if not input_name.startswith(prefix):
            continue
        parts = input_name[len(prefix) :].split(SEP)
        if types is not None:
            if len(types) != len(parts):
                raise ValueError(f"input {input_name!r} has {len(parts)} label part(s), expected {len(types)}")
            parts = [t(p) for t, p in zip(types, parts)]
        out[parts[0] if len(parts) == 1 else tuple(parts)] = str(path)
    if not out:
        raise KeyError(f"no inputs named {prefix}*; inputs are {[k for k, _ in items]}")
    return out
