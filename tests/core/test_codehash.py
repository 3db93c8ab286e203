"""The code-hash walk reads and parses each file once per process, and still sees a file that changes."""

from __future__ import annotations

import ast
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from paperflow.core import codehash

ROOT = Path(__file__).resolve().parents[2]


def rule_scripts() -> list[Path]:
    """Every `script:` file of the composed workflow (each paper's scripts/ and the shared rules/scripts/)."""
    return sorted([*ROOT.glob("workflows/*/scripts/*.py"), *ROOT.glob("rules/scripts/*.py")])


@pytest.fixture
def parses(monkeypatch, tmp_path) -> Counter[str]:
    """Counts `ast.parse` calls per file name, starting from an empty parse cache and an empty store."""
    counts: Counter[str] = Counter()
    parse = ast.parse

    def counting(source, filename="<unknown>", *args, **kwargs):
        counts[str(filename)] += 1
        return parse(source, filename, *args, **kwargs)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(codehash, "_STORE", None)
    monkeypatch.setattr(codehash, "_IMPORTS", {})
    monkeypatch.setattr(ast, "parse", counting)
    return counts


def test_every_library_module_is_parsed_at_most_once(parses):
    scripts = rule_scripts()
    closures = [codehash.module_closure(script) for script in scripts]
    for script in scripts:
        codehash.code_hash(script)
    shared = Counter(path for closure in closures for _, path in closure)
    assert len(scripts) > 1 and max(shared.values()) > 1  # modules shared between scripts: a cache has work to do
    assert {str(path) for path in shared} <= set(parses)
    assert max(parses.values()) == 1, [name for name, n in parses.items() if n > 1]


def test_a_second_walk_parses_nothing(parses):
    scripts = rule_scripts()
    first = [codehash.code_hash(script) for script in scripts]
    parsed = sum(parses.values())
    assert [codehash.code_hash(script) for script in scripts] == first
    assert sum(parses.values()) == parsed


def test_a_fresh_process_parses_nothing_its_store_holds(parses, monkeypatch):
    scripts = rule_scripts()
    first = [codehash.code_hash(script) for script in scripts]
    assert codehash.store_path().is_file() and sum(parses.values()) > len(scripts)
    parsed = sum(parses.values())
    monkeypatch.setattr(codehash, "_STORE", None)  # what a new process starts from
    monkeypatch.setattr(codehash, "_IMPORTS", {})
    assert [codehash.code_hash(script) for script in scripts] == first
    assert sum(parses.values()) == parsed


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"x": "not a list of names"}'])
def test_a_broken_store_is_ignored(parses, content):
    script = ROOT / "rules" / "scripts" / "summary.py"
    expected = codehash.code_hash(script)
    codehash.store_path().write_text(content)
    codehash._STORE = None
    codehash._IMPORTS.clear()
    assert codehash.code_hash(script) == expected


def package(root: Path, files: dict[str, str]) -> Path:
    """A `paperflow` package under `root` with the given module files (relative path -> source)."""
    pkg = root / "paperflow"
    for rel, text in {"__init__.py": "", "sub/__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_hash_follows_a_changed_module_in_the_same_process(tmp_path, monkeypatch, parses):
    pkg = package(tmp_path, {"sub/a.py": "from . import b\n", "sub/b.py": "X = 1\n", "sub/c.py": "Y = 1\n"})
    monkeypatch.setattr(codehash, "PACKAGE_DIR", pkg)
    script = tmp_path / "s.py"
    script.write_text("from paperflow.sub.a import *\n")
    before = codehash.code_hash(script)
    (pkg / "sub" / "b.py").write_text("X = 2\n")  # same size: only the content tells
    changed = codehash.code_hash(script)
    assert changed != before
    (pkg / "sub" / "a.py").write_text("from . import c\n")
    names = [name for name, _ in codehash.module_closure(script)]
    assert "paperflow.sub.c" in names and "paperflow.sub.b" not in names
    assert parses[str(pkg / "sub" / "a.py")] == 2
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    assert codehash.code_hash(script) == changed


def test_a_settled_file_is_read_once_and_still_seen_when_it_changes(tmp_path, monkeypatch):
    """A file whose last change lies SETTLED_NS before the read is not read again while its stat signature holds;
    a rewrite of the same size with its old mtime put back still moves the ctime, so the hash follows it."""
    pkg = package(tmp_path, {"sub/a.py": "X = 1\n"})
    monkeypatch.setattr(codehash, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(codehash, "SETTLED_NS", 50_000_000)
    monkeypatch.setattr(codehash, "_DIGESTS", {})
    script = tmp_path / "s.py"
    script.write_text("import paperflow.sub.a\n")
    module = pkg / "sub" / "a.py"
    time.sleep(0.1)
    reads: Counter[str] = Counter()
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.update([self.name]) or read_bytes(self))
    before = codehash.code_hash(script)
    assert codehash.code_hash(script) == before and reads["a.py"] == 1
    mtime = module.stat().st_mtime_ns
    module.write_text("X = 2\n")
    os.utime(module, ns=(mtime, mtime))
    time.sleep(0.1)
    assert codehash.code_hash(script) != before and reads["a.py"] == 2


def test_a_file_changed_just_before_its_read_is_read_again(tmp_path, monkeypatch):
    pkg = package(tmp_path, {"sub/a.py": "X = 1\n"})
    monkeypatch.setattr(codehash, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(codehash, "_DIGESTS", {})
    script = tmp_path / "s.py"
    script.write_text("import paperflow.sub.a\n")
    before = codehash.code_hash(script)
    (pkg / "sub" / "a.py").write_text("X = 2\n")  # within the same timestamp tick, perhaps: not trusted to differ
    assert codehash.code_hash(script) != before
    assert codehash._DIGESTS == {}
