"""Benchmark: how long `snakemake -n` of the whole DAG takes (every enabled paper, smoke scale by default): what
every Snakemake command a user types pays, and every job Snakemake starts on a cluster node (issue 56).

    .venv/bin/python tools/bench/dag_build.py [--repeats 3] [--scale smoke] [--target 2.5]

Runs in the repository root, as a user's `snakemake -n` does. Prints the median wall and CPU time (user + system
of the child) over the repeats, and the same for `snakemake --version`, the floor the workflow cannot lower: it
imports Snakemake and its plugins (the SLURM executor plugin runs `scontrol show config` while it loads, which
waits up to 10 s where the SLURM commands are installed and no controller answers). Not a test: timings depend on
the machine and its load (compare the CPU column on a loaded machine). Exits non-zero only when a run fails;
--target prints whether the median wall time is within it (on an idle 2-core machine: 2.5 s).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of the Snakemake CLI with `args` in the repository root."""
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    env = dict(os.environ, WANDB_MODE="disabled")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([snakemake, *args], cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_of(args: list[str], repeats: int) -> tuple[float, float]:
    runs = [timed(args) for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", default="smoke")
    parser.add_argument("--target", type=float, default=2.5, help="seconds of wall time (idle 2-core machine)")
    opts = parser.parse_args()
    rows = {
        f"snakemake -n (scale={opts.scale})": median_of(
            ["-n", "--quiet", "--config", f"scale={opts.scale}"], opts.repeats
        ),
        "snakemake --version (the floor)": median_of(["--version"], opts.repeats),
    }
    load = os.getloadavg()[0]
    print(f"DAG build, median of {opts.repeats} on {os.cpu_count()} cores (load average {load:.1f}):")
    print(f"{'command':<36} {'wall s':>7} {'CPU s':>7}")
    for name, (wall, cpu) in rows.items():
        print(f"{name:<36} {wall:7.2f} {cpu:7.2f}")
    wall = next(iter(rows.values()))[0]
    verdict = "within" if wall <= opts.target else "over"
    print(f"median wall {wall:.2f} s: {verdict} the {opts.target} s target (stated for an idle 2-core machine)")


if __name__ == "__main__":
    main()
