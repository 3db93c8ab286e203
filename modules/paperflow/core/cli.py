"""`paperflow audit <file>` and `paperflow lineage <file>`."""

from __future__ import annotations

import argparse
import sys

from paperflow.core.provenance import audit, lineage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="paperflow", description="Inspect the provenance of pipeline outputs.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_audit = sub.add_parser("audit", help="verify every hash from FILE back to its sources; exit 1 on any problem")
    p_audit.add_argument("file")
    p_lineage = sub.add_parser("lineage", help="print the tree of jobs and files behind FILE")
    p_lineage.add_argument("file")
    args = parser.parse_args(argv)
    if args.command == "lineage":
        print("\n".join(lineage(args.file)))
        return 0
    report = audit(args.file)
    for problem in report.problems:
        print(f"FAIL {problem}", file=sys.stderr)
    status = "OK" if report.ok else "FAILED"
    print(
        f"audit {status}: {report.target}: {len(report.checked)} record(s) checked across "
        f"{len(set(report.rules.values()))} rule(s), {len(report.sources)} source file(s), {len(report.problems)} problem(s)"
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
