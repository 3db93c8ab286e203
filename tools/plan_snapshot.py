"""Write the planned jobs of every paper at every scale to tests/data/plans/<scale>.json.gz (code hashes left out),
the snapshots `tests/workflow/test_plan_equal.py` holds the workflows to. Rerun it only for a change that means to
move jobs (a new stage, other params, another resource class), and say so in the commit.

    python tools/plan_snapshot.py [SCALE ...]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "modules"))

from paperflow.core.config import SCALES, available_papers  # noqa: E402
from paperflow.core.jobtable import plan_of, without_code_hash  # noqa: E402

SNAPSHOTS = ROOT / "tests" / "data" / "plans"


def snapshot_path(scale: str) -> Path:
    return SNAPSHOTS / f"{scale}.json.gz"


def main(scales: list[str]) -> None:
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    papers = available_papers(ROOT)
    for scale in scales or list(SCALES):
        jobs = without_code_hash(plan_of(ROOT, scale, papers))
        text = json.dumps(jobs, sort_keys=True, separators=(",", ":")) + "\n"
        with gzip.GzipFile(snapshot_path(scale), "wb", mtime=0) as fh:  # mtime 0: the same plan, the same bytes
            fh.write(text.encode())
        print(f"{snapshot_path(scale).relative_to(ROOT)}: {len(jobs)} jobs")


if __name__ == "__main__":
    main(sys.argv[1:])
