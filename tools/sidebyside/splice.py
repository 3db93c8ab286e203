"""Put a generated markdown block into a README between `<!-- NAME:start -->` and `<!-- NAME:end -->`."""

from __future__ import annotations

from pathlib import Path


def splice(readme: Path, name: str, text: str) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    content = readme.read_text()
    if start not in content or end not in content:
        raise SystemExit(f"{readme}: no {start} ... {end} block to fill")
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{text.rstrip()}\n{end}{tail}")
