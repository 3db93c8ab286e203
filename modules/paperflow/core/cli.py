"""`paperflow audit <file|dir>`, `paperflow lineage <file>`, `paperflow record write|check|readme` and
`paperflow pin <slug>`.

Every error is one line on stderr naming the file or argument, the problem and what to do, with a non-zero exit
code; an error nobody foresaw is one line too (set PAPERFLOW_TRACEBACK=1 to see its traceback)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from paperflow.core.config import SCALES, available_papers, repo_root
from paperflow.core.provenance import UnreadableRecord, audit, lineage, read_record, record_path
from paperflow.core.record import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    RecordError,
    Tolerance,
    check_record,
    findings_table,
    refresh_readme,
    restamp_record,
    write_record,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # every character str.splitlines breaks at, and more


def _err(message: str) -> None:
    """One line on stderr: a control character in it (a newline in a file's name) is written escaped."""
    print(_CONTROL.sub(lambda m: repr(m.group())[1:-1], message), file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage itself is in `--help`); subparsers inherit it."""

    def error(self, message: str) -> NoReturn:
        _err(f"{self.prog}: {message}; see `{self.prog} --help`")
        self.exit(2)


def _scale(value: str) -> str:
    if value not in SCALES:
        raise argparse.ArgumentTypeError(f"no scale {value!r}; the scales are {', '.join(SCALES)}")
    return value


def _tolerance(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a tolerance; give a finite number >= 0, such as 1e-6")
    return number


def _file(value: str) -> str:
    if "\0" in value:
        raise argparse.ArgumentTypeError(f"{value!r} holds a NUL byte, which no file name can; check the path")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="paperflow", description="Inspect the provenance and record the results.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_audit = sub.add_parser(
        "audit",
        help="verify FILE's job and every hash back to its sources, or every record and file under a "
        "directory; exit 1 on any problem",
    )
    p_audit.add_argument("file", type=_file)
    p_lineage = sub.add_parser("lineage", help="print the tree of jobs and files behind FILE")
    p_lineage.add_argument("file", type=_file)
    p_record = sub.add_parser("record", help="the results on record, docs/results/<scale>.{json,md}")
    actions = p_record.add_subparsers(dest="action", required=True)
    p_write = actions.add_parser("write", help="write the record from the audited results/<scale> tree")
    p_check = actions.add_parser("check", help="compare a fresh results/<scale> tree with the committed record")
    p_restamp = actions.add_parser(
        "restamp",
        help="carry papers' record across a change that moves none of their jobs at SCALE (the plan at --since, code "
        "hashes included, equals today's); any other change needs a rerun",
    )
    p_restamp.add_argument("--scale", required=True, type=_scale, help=f"one of {', '.join(SCALES)}")
    p_restamp.add_argument("--papers", nargs="+", required=True, help="the papers whose entries are carried")
    p_restamp.add_argument("--since", required=True, help="the commit whose code the record's entries vouch for")
    p_restamp.add_argument(
        "--record", type=_file, default="docs/results", help="the committed record (default: docs/results)"
    )
    p_readme = actions.add_parser("readme", help="rewrite README.md's status table from docs/results/<scale>.json")
    p_readme.add_argument(
        "--record", type=_file, default="docs/results", help="the committed record (default: docs/results)"
    )
    p_readme.add_argument("--readme", type=_file, default="README.md")
    for p in (p_write, p_check):
        p.add_argument("--scale", required=True, type=_scale, help=f"one of {', '.join(SCALES)}")
        p.add_argument("--results", type=_file, default="results", help="the results root (default: results)")
    p_write.add_argument(
        "--out", type=_file, default="docs/results", help="where the record goes (default: docs/results)"
    )
    p_write.add_argument(
        "--papers",
        nargs="+",
        default=None,
        help="update only these papers' entries of the existing record (the others are kept as recorded)",
    )
    p_check.add_argument(
        "--record", type=_file, default="docs/results", help="the committed record (default: docs/results)"
    )
    p_check.add_argument(
        "--rtol", type=_tolerance, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL:g})"
    )
    p_check.add_argument(
        "--atol", type=_tolerance, default=DEFAULT_ATOL, help=f"absolute tolerance (default {DEFAULT_ATOL:g})"
    )
    p_pin = sub.add_parser(
        "pin",
        help="download a paper's files that have no published checksum (network needed), compute their sha256 and "
        "write config/locks/<slug>.json, which its download rules then verify against",
    )
    p_pin.add_argument("slug")
    p_pin.add_argument(
        "--scale", default="paper", type=_scale, help="the scale whose downloads are pinned (default: paper)"
    )
    p_pin.add_argument("--cores", type=int, default=2)
    p_plan = sub.add_parser(
        "plan",
        help="per paper, what a run at SCALE asks of a cluster (jobs per rule, GPU jobs and hours, CPU hours, largest "
        "memory) from Snakemake's dry run, and the downloads still without a checksum",
    )
    p_plan.add_argument("papers", nargs="*", help="slugs (default: every paper)")
    p_plan.add_argument("--scale", default="paper", type=_scale, help=f"one of {', '.join(SCALES)} (default: paper)")
    p_plan.add_argument(
        "--readme",
        type=_file,
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
                _err(f"profiles: {link} exists and is not this checkout's; --force replaces it")
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
        PlanError,
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
        _err(f"plan: unknown paper(s) {unknown}; papers: {', '.join(known)}")
        return 2
    root = repo_root()
    try:
        text = dry_run(root, args.scale, papers)
    except PlanError as exc:
        _err(f"plan: {exc}")
        return 1
    rows = plan_rows(parse_dry_run(text), papers, args.scale, root)
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
    import subprocess

    from paperflow.core.download import PIN_ENV, lock_path
    from paperflow.core.plan import last_message

    papers = available_papers()
    if args.slug not in papers:
        _err(f"pin: no paper {args.slug!r}; papers: {', '.join(papers)}")
        return 2
    root = repo_root()
    snakemake = [sys.executable, "-m", "snakemake"]
    config = ["--config", f"scale={args.scale}", f"papers=[{args.slug}]"]
    listed = subprocess.run([*snakemake, "--list-rules", *config], cwd=root, capture_output=True, text=True)
    rules = [
        r for r in re.findall(r"^\s*(\S+)", listed.stdout, re.M) if r.startswith(f"{args.slug}_") and "download" in r
    ]
    if listed.returncode or not rules:
        why = last_message(listed.stderr) if listed.returncode else "Snakemake lists none"
        _err(f"pin: no download rule of {args.slug} found ({why}); see `snakemake --list-rules {' '.join(config)}`")
        return 1
    env = {**os.environ, PIN_ENV: args.slug}
    cmd = [*snakemake, "--cores", str(args.cores), *config, "--until", *rules]
    print("pin: " + " ".join(cmd[2:]))
    code = subprocess.run(cmd, cwd=root, env=env).returncode
    lock = lock_path(args.slug, root)
    if code == 0:
        print(
            f"pin: {lock} holds the sha256 of the files without a published checksum; commit it"
            if lock.is_file()
            else f"pin: every {args.slug} download at scale {args.scale} already had a checksum"
        )
    return code


def _audit(target: str) -> int:
    report = audit(target)
    for problem in report.problems:
        _err(f"FAIL {problem}")
    status = "OK" if report.ok else "FAILED"
    print(
        f"audit {status}: {report.target}: {report.jobs} job(s) and {len(report.checked)} record(s) checked across "
        f"{len(set(report.rules.values()))} rule(s), {report.hashed} file(s) hashed, "
        f"{len(report.deleted)} temporary file(s) deleted (checked by their records), "
        f"{len(report.sources)} source file(s), {len(report.problems)} problem(s)"
    )
    return 0 if report.ok else 1


def _record(args: argparse.Namespace) -> int:
    try:
        if args.action == "readme":
            changed = refresh_readme(args.readme, args.record, available_papers(), repo_root())
            print(f"{args.readme}: status table {'rewritten' if changed else 'already up to date'}")
            return 0
        if args.action == "restamp":
            for line in restamp_record(args.record, args.scale, args.papers, args.since):
                print(f"restamped {line}")
            return 0
        if args.action == "write":
            json_path, md_path = write_record(args.results, args.scale, args.out, papers_only=args.papers)
            print(f"record written: {json_path} and {md_path}")
            return 0
        tolerance = Tolerance(rtol=args.rtol, atol=args.atol)
        findings = check_record(args.results, args.scale, args.record, tolerance)
    except RecordError as exc:
        for problem in exc.problems:
            _err(f"FAIL {problem}")
        _err(f"record {args.action} refused: {exc}")
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


def _lineage(target: str) -> int:
    path = Path(target)
    if path.is_dir():
        _err(f"lineage: {target} is a directory; give one file (`paperflow audit` takes a directory)")
        return 2
    if not path.exists() and not record_path(path).exists():
        _err(f"lineage: no such file {target}; check the path")
        return 1
    try:
        read_record(path)
    except FileNotFoundError:
        _err(
            f"lineage: no provenance record {record_path(target)} for {target}: a file no job of the workflow wrote, "
            "or whose record was deleted; rerun the job that writes it"
        )
        return 1
    except UnreadableRecord as exc:
        _err(f"lineage: unreadable record {exc}")
        return 1
    problems: list[str] = []
    print("\n".join(lineage(target, problems)))
    for problem in problems:
        _err(f"lineage: unreadable record {problem}")
    return 1 if problems else 0


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines)[:500] or repr(exc)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except Exception as exc:  # the safety net: every error that reaches the user is one line
        if os.environ.get("PAPERFLOW_TRACEBACK"):
            raise
        _err(
            f"paperflow {args.command}: unexpected {type(exc).__name__}: {_one_line(exc)}; a bug of paperflow: rerun "
            "with PAPERFLOW_TRACEBACK=1 and report the traceback"
        )
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "lineage":
        return _lineage(args.file)
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
