"""`paperflow audit <file|dir>`, `paperflow lineage <file>`, `paperflow record write|check|readme` and
`paperflow pin <slug>`."""

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
    p_pin = sub.add_parser(
        "pin",
        help="download a paper's files that have no published checksum (network needed), compute their sha256 and "
        "write config/locks/<slug>.json, which its download rules then verify against",
    )
    p_pin.add_argument("slug")
    p_pin.add_argument("--scale", default="paper", help="the scale whose downloads are pinned (default: paper)")
    p_pin.add_argument("--cores", type=int, default=2)
    p_plan = sub.add_parser(
        "plan",
        help="per paper, what a run at SCALE asks of a cluster (jobs per rule, GPU jobs and hours, CPU hours, largest "
        "memory) from Snakemake's dry run, and the downloads still without a checksum",
    )
    p_plan.add_argument("papers", nargs="*", help="slugs (default: every paper)")
    p_plan.add_argument("--scale", default="paper")
    p_plan.add_argument(
        "--readme",
        default=None,
        help="also write the table into this file's plan block (given papers: only their rows change)",
    )
    p_prof = sub.add_parser(
        "profiles",
        help="link the project's Snakemake profiles (profiles/<name>) where Snakemake looks names up, so that "
        "`snakemake --profile slurm` works as typed (run it from the checkout)",
    )
    p_prof.add_argument("action", choices=["install"])
    p_prof.add_argument("--dest", default=None, help="default: $XDG_CONFIG_HOME/snakemake or ~/.config/snakemake")
    p_prof.add_argument("--force", action="store_true", help="replace an existing entry of the same name")
    return parser


def _profiles(args: argparse.Namespace) -> int:
    import os
    import shutil
    from pathlib import Path

    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    dest = Path(args.dest) if args.dest else Path(base) / "snakemake"
    dest.mkdir(parents=True, exist_ok=True)
    code = 0
    for profile in sorted(p for p in (repo_root() / "profiles").iterdir() if (p / "profile.yaml").is_file()):
        link = dest / profile.name
        if link.is_symlink() and link.resolve() == profile.resolve():
            print(f"profiles: {link} -> {profile} (already)")
            continue
        if link.exists() or link.is_symlink():
            if not args.force:
                print(f"profiles: {link} exists and is not this checkout's; --force replaces it", file=sys.stderr)
                code = 1
                continue
            if link.is_symlink() or link.is_file():
                link.unlink()
            else:
                shutil.rmtree(link)
        link.symlink_to(profile.resolve(), target_is_directory=True)
        print(f"profiles: {link} -> {profile}")
    return code


def _plan(args: argparse.Namespace) -> int:
    from paperflow.core.plan import (
        dry_run,
        merge_rows,
        parse_dry_run,
        plan_rows,
        readme_rows,
        render,
        unpinned_reasons,
        write_readme_block,
    )

    known = available_papers()
    papers = args.papers or known
    unknown = [p for p in papers if p not in known]
    if unknown:
        print(f"plan: unknown paper(s) {unknown}; papers: {', '.join(known)}", file=sys.stderr)
        return 2
    root = repo_root()
    rows = plan_rows(parse_dry_run(dry_run(root, args.scale, papers)), papers, args.scale, root)
    if args.readme and args.papers:  # a subset: the README keeps the other papers' rows as they are
        rows = merge_rows(readme_rows(args.readme), rows, known)
    table = render(rows, args.scale, unpinned_reasons(root))
    print(table)
    if args.readme:
        changed = write_readme_block(args.readme, table)
        print(f"{args.readme}: plan block {'rewritten' if changed else 'already up to date'}")
    return 0


def _pin(args: argparse.Namespace) -> int:
    """Run the paper's download rules at `scale` with PAPERFLOW_PIN naming it: every file without a checksum is
    fetched once and its sha256 written to the lock file; files already pinned are verified as usual."""
    import os
    import re
    import subprocess

    from paperflow.core.download import PIN_ENV, lock_path

    papers = available_papers()
    if args.slug not in papers:
        print(f"pin: no paper {args.slug!r}; papers: {', '.join(papers)}", file=sys.stderr)
        return 2
    root = repo_root()
    snakemake = [sys.executable, "-m", "snakemake"]
    config = ["--config", f"scale={args.scale}", f"papers=[{args.slug}]"]
    listed = subprocess.run([*snakemake, "--list-rules", *config], cwd=root, capture_output=True, text=True)
    rules = [
        r for r in re.findall(r"^\s*(\S+)", listed.stdout, re.M) if r.startswith(f"{args.slug}_") and "download" in r
    ]
    if listed.returncode or not rules:
        print(f"pin: no download rule of {args.slug} found\n{listed.stderr[-2000:]}", file=sys.stderr)
        return 1
    env = {**os.environ, PIN_ENV: args.slug}
    cmd = [*snakemake, "--cores", str(args.cores), *config, "--until", *rules]
    print("pin: " + " ".join(cmd[2:]))
    code = subprocess.run(cmd, cwd=root, env=env).returncode
    lock = lock_path(args.slug, root)
    if code == 0:
        print(f"pin: {lock} holds the sha256 of the files without a published checksum; commit it" if lock.is_file()
              else f"pin: every {args.slug} download at scale {args.scale} already had a checksum")  # fmt: skip
    return code


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
    if args.command == "pin":
        return _pin(args)
    if args.command == "plan":
        return _plan(args)
    if args.command == "profiles":
        return _profiles(args)
    return _audit(args.file)


if __name__ == "__main__":
    sys.exit(main())
