"""Hash the library code a stage runs, so that editing it reruns that stage.

Snakemake tracks the `script:` file of a rule but not the modules that script imports. A rule
therefore carries `code_hash(<script>)` as a param: the sha256 over every `paperflow` module the
script imports, transitively (found by reading the import statements, without importing anything,
so the Snakefile stays fast and needs no torch).

Each file's imports are parsed once per content (kept with the sha256 they were parsed from), and each file is
read and hashed once per process: its sha256 is kept with its stat signature (inode, size, mtime, ctime) and
reused while that is unchanged, so a file edited while the process lives (a long-running Snakemake API session,
a test) is read again. Git's "racily clean" rule keeps this exact: a file whose mtime or ctime is less than
SETTLED_NS before the read could change again within the same timestamp tick, so its sha256 is not kept (it is
read at each walk) until it has settled; any later write moves its ctime, which no tool sets back.

Parsing is most of a fresh process's walk (a Snakemake command parses some 400 files), so the names parsed from a
content are also kept across processes, addressed by the content's sha256 (with the module name, and the Python
version that parsed them), in the user's cache folder (`$XDG_CACHE_HOME/paperflow`, else `~/.cache/paperflow`):
a content maps to one set of names, so a kept entry is never stale. An unreadable or unwritable store is ignored.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "paperflow"
PACKAGE_DIR = Path(__file__).resolve().parents[1]

# fields of a statement (or except handler, match case) that hold a list of statements
_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")

# how long before a read a file's last change must lie for the read to be kept: wider than any file system's
# timestamp tick (2 s on FAT, 1 s on ext3; nanoseconds, but a kernel clock tick of a few ms, on ext4 and tmpfs)
SETTLED_NS = 2_000_000_000

# file -> (stat signature, sha256 of the content): the settled files read in this process
_DIGESTS: dict[Path, tuple[tuple[int, int, int, int], str]] = {}
# (file, module name) -> (sha256 of the content parsed, names it imports)
_IMPORTS: dict[tuple[Path, str], tuple[str, frozenset[str]]] = {}
# the store kept across processes: "<sha256> <module> <package?>" -> names; loaded at the first parse it may save
STORE_FORMAT = 1  # raise it whenever _parse_imports changes what it finds in a content
STORE_LIMIT = 5000  # entries; past it a save keeps only the ones this process used
_STORE: dict[str, list[str]] | None = None
_STORE_USED: set[str] = set()
_STORE_DIRTY = False


def module_file(name: str) -> Path | None:
    """Source file of a `paperflow.*` module name, or None if it is not part of this package."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = os.path.join(PACKAGE_DIR, *name.split(".")[1:])  # strings, not Paths: the walk asks this very often
    for candidate in (os.path.join(base, "__init__.py"), base + ".py"):
        if os.path.isfile(candidate):
            return Path(candidate)
    return None


def _statements(tree: ast.Module) -> Iterator[ast.AST]:
    """Every statement of `tree`, nested ones (in functions, classes, if/try/with/match blocks) included.
    Import statements live only in statement bodies, so expressions, far more numerous, are skipped."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        for field in _BLOCK_FIELDS:
            todo.extend(getattr(node, field, ()))


def _parse_imports(source: bytes, path: Path, module: str) -> frozenset[str]:
    """Every module name `source` (the file `path`, imported as `module`) imports, relative ones resolved."""
    tree = ast.parse(source, filename=str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            names.add(parent)
            names.update(f"{parent}.{alias.name}" for alias in node.names)
    return frozenset(names)


def _digest(path: Path) -> tuple[str, bytes | None]:
    """(sha256 of `path`, its content, or None where the sha256 is the one kept for its unchanged stat signature)."""
    st = path.stat()
    signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    kept = _DIGESTS.get(path)
    if kept is not None and kept[0] == signature:
        return kept[1], None
    read_at = time.time_ns()
    source = path.read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    if max(st.st_mtime_ns, st.st_ctime_ns) < read_at - SETTLED_NS:
        _DIGESTS[path] = (signature, digest)
    return digest, source


def store_path() -> Path:
    """The file of the imports kept across processes (one per Python version and store format)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    return Path(root, "paperflow", f"imports-v{STORE_FORMAT}-py{version}.json")


def _store() -> dict[str, list[str]]:
    global _STORE
    if _STORE is None:
        try:
            kept = json.loads(store_path().read_text())
        except (OSError, ValueError):
            kept = {}
        if not isinstance(kept, dict):
            kept = {}
        _STORE = {k: v for k, v in kept.items() if isinstance(v, list) and all(isinstance(n, str) for n in v)}
    return _STORE


def _save_store() -> None:
    """Write the store if this process added to it (atomically: a concurrent writer's entries may be lost, never
    mixed in)."""
    global _STORE_DIRTY
    if not _STORE_DIRTY:
        return
    _STORE_DIRTY = False
    store = _store()
    if len(store) > STORE_LIMIT:
        store = {key: names for key, names in store.items() if key in _STORE_USED}
    path = store_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as fh:
            json.dump(store, fh)
        os.replace(fh.name, path)
    except OSError:
        pass


def _imported_names(path: Path, module: str) -> tuple[str, frozenset[str]]:
    """(sha256 of `path`, the names it imports): parsed only when neither this process nor the store has the names
    of this content."""
    global _STORE_DIRTY
    digest, source = _digest(path)
    cached = _IMPORTS.get((path, module))
    if cached is not None and cached[0] == digest:
        return cached
    key = f"{digest} {module} {int(path.name == '__init__.py')}"
    kept = _store().get(key)
    if kept is None:
        kept = sorted(_parse_imports(path.read_bytes() if source is None else source, path, module))
        _store()[key] = kept
        _STORE_DIRTY = True
    _STORE_USED.add(key)
    entry = (digest, frozenset(kept))
    _IMPORTS[(path, module)] = entry
    return entry


def _closure(script: Path) -> dict[str, tuple[Path, str]]:
    """Module name -> (file, sha256) of every paperflow module that `script` imports, directly or not."""
    if not script.is_file():
        raise FileNotFoundError(f"no script {script}")
    seen: dict[str, tuple[Path, str]] = {}
    visited: set[str] = set()
    todo = sorted(_imported_names(script, "__main__")[1])
    while todo:
        name = todo.pop()
        if name in visited:
            continue
        visited.add(name)
        path = module_file(name)
        if path is None:
            continue
        digest, names = _imported_names(path, name)
        seen[name] = (path, digest)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(2, len(parts)))  # parent packages run too
        todo.extend(names)
    _save_store()
    return seen


def module_closure(script: str | Path) -> tuple[tuple[str, Path], ...]:
    """(module name, file) of every paperflow module that `script` imports, directly or not."""
    return tuple(sorted((name, path) for name, (path, _) in _closure(Path(script)).items()))


def file_hashes(script: str | Path) -> dict[str, str]:
    """sha256 of each library file in the closure of `script`, keyed by path relative to modules/."""
    return {str(path.relative_to(PACKAGE_DIR.parent)): digest for path, digest in _closure(Path(script)).values()}


def code_hash(script: str | Path) -> str:
    """One sha256 over the library closure of `script` (file names and contents)."""
    digest = hashlib.sha256()
    for rel, sha in sorted(file_hashes(script).items()):
        digest.update(f"{rel}\0{sha}\n".encode())
    return digest.hexdigest()
