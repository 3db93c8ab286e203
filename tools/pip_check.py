"""`pip check`, failing on any inconsistency except the ones listed in envs/pip-check-allowed.txt.

Usage: python tools/pip_check.py   (exit 1 and the offending lines on an unexpected conflict)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ALLOWED = Path(__file__).resolve().parents[1] / "envs" / "pip-check-allowed.txt"


def allowed_lines(path: Path = ALLOWED) -> set[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def unexpected(report: str, allowed: set[str]) -> list[str]:
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    return [line for line in lines if line not in allowed and not line.startswith("No broken requirements")]


def main() -> int:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    bad = unexpected(proc.stdout + proc.stderr, allowed_lines())
    if bad:
        print("pip check found conflicts not in envs/pip-check-allowed.txt:", *bad, sep="\n  ", file=sys.stderr)
        return 1
    print(f"pip check: consistent apart from {len(allowed_lines())} allowed lines (envs/pip-check-allowed.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
