"""`paperflow audit <file|dir>`, `paperflow lineage <file>` and `paperflow record write|check`."""

from __future__ import annotations

import argparse
import sys

from paperflow.core.config import available_papers, repo_root
from paperflow.core.provenance import audit, lineage
from paperflow.core.record import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    RecordError,
    Tolerance,
    check_record,
    findings_table,
    refresh_readme,
    write_record,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paperflow", description="Inspect the provenance and record the results.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_audit = sub.add_parser(
        "audit",
        help="verify FILE's job and every hash back to its sources, or every record and file under a "
        "directory; exit 1 on any problem",
    )
    p_audit.add_argument("file")
    p_lineage = sub.add_parser("lineage", help="print the tree of jobs and files behind FILE")
    p_lineage.add_argument("file")
    p_record = sub.add_parser("record", help="the results on record, docs/results/<scale>.{json,md}")
    actions = p_record.add_subparsers(dest="action", required=True)
    p_write = actions.add_parser("write", help="write the record from the audited results/<scale> tree")
    p_check = actions.add_parser("check", help="compare a fresh results/<scale> tree with the committed record")
    p_readme = actions.add_parser("readme", help="rewrite README.md's status table from docs/results/<scale>.json")
    p_readme.add_argument("--record", default="docs/results", help="the committed record (default: docs/results)")
    p_readme.add_argument("--readme", default="README.md")
    for p in (p_write, p_check):
        p.add_argument("--scale", required=True)
        p.add_argument("--results", default="results", help="the results root (default: results)")
    p_write.add_argument("--out", default="docs/results", help="where the record goes (default: docs/results)")
    p_write.add_argument(
        "--papers",
        nargs="+",
        default=None,
        help="update only these papers' entries of the existing record (the others are kept as recorded)",
    )
    p_check.add_argument("--record", default="docs/results", help="the committed record (default: docs/results)")
    p_check.add_argument(
        "--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL:g})"
    )
    p_check.add_argument(
        "--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default {DEFAULT_ATOL:g})"
    )
    return parser


def _audit(target: str) -> int:
    report = audit(target)
    for problem in report.problems:
        print(f"FAIL {problem}", file=sys.stderr)
    status = "OK" if report.ok else "FAILED"
    print(
        f"audit {status}: {report.target}: {report.jobs} job(s) and {len(report.checked)} record(s) checked across "
        f"{len(set(report.rules.values()))} rule(s), {report.hashed} file(s) hashed, "
        f"{len(report.sources)} source file(s), {len(report.problems)} problem(s)"
    )
    return 0 if report.ok else 1


def _record(args: argparse.Namespace) -> int:
    try:
        if args.action == "readme":
            changed = refresh_readme(args.readme, args.record, available_papers(), repo_root())
            print(f"{args.readme}: status table {'rewritten' if changed else 'already up to date'}")
            return 0
        if args.action == "write":
            json_path, md_path = write_record(args.results, args.scale, args.out, papers_only=args.papers)
            print(f"record written: {json_path} and {md_path}")
            return 0
        tolerance = Tolerance(rtol=args.rtol, atol=args.atol)
        findings = check_record(args.results, args.scale, args.record, tolerance)
    except RecordError as exc:
        print(f"record {args.action} refused: {exc}", file=sys.stderr)
        return 1
    failures = sum(f.level == "FAIL" for f in findings)
    print(f"record check of {args.results}/{args.scale} against {args.record}/{args.scale}.json")
    print(f"tolerance: {tolerance.describe()}")
    if findings:
        print(findings_table(findings, tolerance))
    print(
        f"record check {'FAILED' if failures else 'OK'}: {failures} failure(s), {len(findings) - failures} warning(s)"
    )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "lineage":
        print("\n".join(lineage(args.file)))
        return 0
    if args.command == "record":
        return _record(args)
    return _audit(args.file)


if __name__ == "__main__":
    sys.exit(main())
