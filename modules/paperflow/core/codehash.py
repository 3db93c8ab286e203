"""Hash the library code a stage runs, so that editing it reruns that stage.

Snakemake tracks the `script:` file of a rule but not the modules that script imports. A rule
therefore carries `code_hash(<script>)` as a param: the sha256 over every `paperflow` module the
script imports, transitively (found by reading the import statements, without importing anything,
so the Snakefile stays fast and needs no torch).
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

PACKAGE = "paperflow"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def module_file(name: str) -> Path | None:
    """Source file of a `paperflow.*` module name, or None if it is not part of this package."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    rel = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / rel / "__init__.py", (PACKAGE_DIR / rel).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
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
    return names


@cache
def module_closure(script: str | Path) -> tuple[tuple[str, Path], ...]:
    """(module name, file) of every paperflow module that `script` imports, directly or not."""
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no script {script}")
    seen: dict[str, Path] = {}
    todo = sorted(_imported_names(script, "__main__"))
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(2, len(parts)))  # parent packages run too
        todo.extend(_imported_names(path, name))
    return tuple(sorted(seen.items()))


def file_hashes(script: str | Path) -> dict[str, str]:
    """sha256 of each library file in the closure of `script`, keyed by path relative to modules/."""
    return {
        str(path.relative_to(PACKAGE_DIR.parent)): hashlib.sha256(path.read_bytes()).hexdigest()
        for _, path in module_closure(script)
    }


def code_hash(script: str | Path) -> str:
    """One sha256 over the library closure of `script` (file names and contents)."""
    digest = hashlib.sha256()
    for rel, sha in sorted(file_hashes(script).items()):
        digest.update(f"{rel}\0{sha}\n".encode())
    return digest.hexdigest()
