"""Check that the issue-31 test fails on the model before the fix: runs
tests/papers/test_spaef.py::test_the_denoiser_output_has_spot_level_signal with legacy.py's patch, at the
smoke lr before the fix (1e-3) and at the config's lr. Prints the pytest outcome of each (expected: failed).

    .venv/bin/python tools/sidebyside/spaef/check_old_model.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
TEST = "tests/papers/test_spaef.py::test_the_denoiser_output_has_spot_level_signal"
CHILD = """
import sys
sys.path.insert(0, {here!r})
from legacy import legacy_model
import paperflow.core.config as config
load = config.load_paper_config
lr = {lr!r}
def patched(slug, scale, root=None):
    cfg = load(slug, scale, root)
    if lr is not None:
        cfg["train"]["lr"] = lr
    return cfg
config.load_paper_config = patched
import pytest
with legacy_model():
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", {test!r}]))
"""


def main() -> None:
    for lr in (1e-3, None):
        code = CHILD.format(here=str(HERE), lr=lr, test=TEST)
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        keep = ("AssertionError: ", " failed", " passed")
        lines = [ln.strip() for ln in run.stdout.splitlines() if any(k in ln for k in keep)]
        print(f"model before issue 31, lr {lr if lr is not None else 'of the config'}: exit {run.returncode}")
        print("\n".join("  " + ln for ln in lines[-3:]))


if __name__ == "__main__":
    main()
