"""Rewrite the measured block of a paper's README from the pipeline's metrics, so that no value there is typed.

    python tools/measured_block.py eapo [--scales cpu smoke]

Between `<!-- measured:start -->` and `<!-- measured:end -->` of workflows/<slug>/README.md it writes, per scale,
one row per claim of results/<scale>/<slug>/metrics.json: gated or not, estimate [CI], units, verdict and the
control's estimate and verdict. A scale without results is an error, never skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- measured:start -->", "<!-- measured:end -->"
PRIOR = ("base_accuracy", "prior_accuracy", "prior_validation_accuracy", "prior_steps")  # eapo's pi_E line


def fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def interval(c) -> str:
    return f"{fmt(c.get('value'))} [{fmt(c.get('ci_low'))}, {fmt(c.get('ci_high'))}]"


def table(metrics: dict) -> list[str]:
    rows = [
        "| claim | gated | estimate [95 % CI] | n | verdict | control: estimate [CI], verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in metrics["claims"]:
        ctrl = c.get("control") or {}
        control = f"`{ctrl['method']}`: {interval(ctrl)}, {ctrl.get('verdict')}" if ctrl.get("method") else "-"
        rows.append(
            f"| `{c['id']}` | {'yes' if c['gated'] else 'no'} | {interval(c)} | {c.get('n_units')} | {c['verdict']} | "
            f"{control} |"
        )
    return rows


def block(slug: str, scales: list[str]) -> str:
    lines = [
        START,
        f"Measured by the pipeline (written by `tools/measured_block.py` from `results/<scale>/{slug}/metrics.json`):",
    ]
    for scale in scales:
        path = ROOT / "results" / scale / slug / "metrics.json"
        if not path.exists():
            raise SystemExit(f"{path.relative_to(ROOT)}: no results at scale {scale}; run the pipeline first")
        metrics = json.loads(path.read_text())
        extra = ""
        if all(k in metrics for k in PRIOR):
            extra = (
                f" (pi_E: greedy test accuracy {metrics['prior_accuracy']:.3f}, validation accuracy "
                f"{metrics['prior_validation_accuracy']:.3f} after {metrics['prior_steps']} steps; base "
                f"{metrics['base_accuracy']:.3f})"
            )
        lines += ["", f"`{scale}`{extra}:", "", *table(metrics)]
    return "\n".join([*lines, END])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slug")
    ap.add_argument("--scales", nargs="+", default=["cpu", "smoke"])
    a = ap.parse_args(argv)
    readme = ROOT / "workflows" / a.slug / "README.md"
    text = readme.read_text()
    if text.count(START) != 1 or text.count(END) != 1:
        raise SystemExit(f"{readme.relative_to(ROOT)}: needs exactly one {START} ... {END} block")
    new = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block(a.slug, a.scales), text, flags=re.S)
    readme.write_text(new)
    print(f"{readme.relative_to(ROOT)}: measured block rewritten ({', '.join(a.scales)})", file=sys.stderr)


if __name__ == "__main__":
    main()
