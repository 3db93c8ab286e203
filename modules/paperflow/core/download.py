"""Fetch one file over HTTP(S) with a required sha256, retries, resumption and an atomic finish.

`pinned_fetch` is what every paper's `<slug>_download` rule calls at paper scale: the sha256 comes from the
paper's config (a checksum its publisher publishes, with the source named beside it) or from the paper's lock
file `config/locks/<slug>.json`, written by `paperflow pin <slug>` (which downloads the unpinned files once, on a
machine with network, and records their sha256); a file with neither is refused with that command in the
message. `fetch` does the transfer. The bytes go to
`<dest>.part`; a transient failure (connection error, timeout, HTTP 5xx or 429) is retried with
exponential backoff and resumed from the bytes already on disk with a `Range` request. Only a
complete file whose checksum matches is renamed onto `dest`, so `dest` either holds the right bytes
or does not exist.

A checksum is a sha256 (64 hex digits, optionally written `sha256:<hex>`), or, where the publisher gives
nothing stronger and labelled as such in the value: `md5:<32 hex>` (a publisher's md5, e.g. torchvision's or a
dataset host's checksum list) or `sha256-prefix:<8-63 hex>` (the sha256 prefix a torch.hub weight file name
carries). The log line of every verified download names the kind it was checked with.

Weak pins get strong: `pinned_fetch` records the sha256 of a file pinned only by an md5 or a sha256 prefix in the
paper's lock file (its `files` section, beside the pins `paperflow pin` writes) when it first downloads it, and
from then on checks both the weak checksum and the recorded sha256; a file that matches the md5 (or prefix) but
not the recorded sha256 is refused. `require_sha256` is the guard before unpickling a downloaded file: it passes
only a file whose sha256 is pinned in the config or recorded in the paper's lock file, never one checked by an md5
or a prefix alone.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC
from pathlib import Path

from tqdm import tqdm

from paperflow.core.config import ConfigError

log = logging.getLogger("paperflow.download")

# kind -> (pattern of the hex part, what the log and errors call it)
CHECKSUM_KINDS = {
    "sha256": (re.compile(r"[0-9a-f]{64}"), "sha256"),
    "md5": (re.compile(r"[0-9a-f]{32}"), "publisher's md5"),
    "sha256-prefix": (re.compile(r"[0-9a-f]{8,63}"), "sha256 prefix (torch.hub file name)"),
}
_CONTENT_RANGE_START = re.compile(r"bytes\s+(\d+)-")
_READ_CHUNK = 1 << 16
_USER_AGENT = "paperflow-download/1 (+urllib)"
_NETWORK_ERRORS = (
    urllib.error.URLError,
    TimeoutError,
    ConnectionError,
    http.client.HTTPException,
    ssl.SSLError,
)


class DownloadError(RuntimeError):
    """A download that cannot succeed: a non-retryable HTTP status, or every attempt failed."""


class ChecksumMismatch(DownloadError):
    """The downloaded bytes do not have the expected checksum."""

    def __init__(self, url: str, dest: Path, expected: str, actual: str, kind: str = "sha256") -> None:
        self.url, self.dest, self.expected, self.actual = url, dest, expected, actual
        super().__init__(
            f"{CHECKSUM_KINDS[kind][1]} mismatch for {url} (destination {dest}): "
            f"expected {expected}, got {actual}; the partial file was deleted"
        )


class UnpinnedDownload(DownloadError, ConfigError):
    """A paper-scale file with no sha256 in the config or the paper's lock file."""


class RecordedSha256Mismatch(ChecksumMismatch):
    """A file pinned by an md5 or a sha256 prefix whose sha256 is not the one recorded on its first download."""

    def __init__(
        self, url: str, dest: Path, pin: str, weak_actual: str | None, recorded: str, actual: str, lock: str
    ) -> None:
        self.url, self.dest, self.expected, self.actual = url, dest, recorded, actual
        kind, digest = parse_checksum(pin)
        label = CHECKSUM_KINDS[kind][1]
        weak = (
            f"matches its {label} {digest}"
            if weak_actual is None
            else f"does not match its {label} {digest} either (it has {weak_actual})"
        )
        DownloadError.__init__(
            self,
            f"{dest}: the file from {url} {weak} but its sha256 is {actual}, not the sha256 {recorded} recorded in "
            f"{lock} when it was first downloaded, so it was refused and deleted. If the publisher replaced the "
            f"file on purpose, check the new one, delete the entry for {url} from {lock} and download again (the new "
            "sha256 is then recorded); otherwise the copy was corrupted or tampered with: do not use it",
        )


class WeakPinError(DownloadError, ConfigError):
    """A pickle (or anything that runs code when loaded) from a file whose sha256 is neither pinned nor recorded."""


class _AlreadyRecorded(Exception):
    """The lock file already records another sha256 for a URL whose first download is being recorded."""

    def __init__(self, sha256: str) -> None:
        self.sha256 = sha256
        super().__init__(sha256)


class _TransientError(Exception):
    """One attempt failed in a way that a later attempt may not."""


def sha256_file(path: str | Path, chunk: int = 1 << 20, algorithm: str = "sha256") -> str:
    """Hex digest (sha256, or `algorithm`) of the file at `path`, read `chunk` bytes at a time."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def parse_checksum(value: str) -> tuple[str, str]:
    """(kind, lower-case hex) of a checksum value: `<64 hex>` or `sha256:<64 hex>`, `md5:<32 hex>`,
    `sha256-prefix:<8-63 hex>`; ValueError naming the accepted forms otherwise."""
    text = value.strip().lower() if isinstance(value, str) else ""
    kind, _, digest = text.rpartition(":") if ":" in text else ("sha256", "", text)
    if kind not in CHECKSUM_KINDS or not CHECKSUM_KINDS[kind][0].fullmatch(digest):
        raise ValueError(
            f"checksum must be 64 hexadecimal characters (a sha256), or md5:<32 hex> (a publisher's md5), or "
            f"sha256-prefix:<8-63 hex> (a torch.hub file name's prefix), got {value!r}"
        )
    return kind, digest


def _matches(path: Path, kind: str, digest: str) -> tuple[bool, str]:
    """(whether the file at `path` has the checksum, the digest it has: the full sha256 for a prefix)."""
    actual = sha256_file(path, algorithm="md5" if kind == "md5" else "sha256")
    return _digest_matches(kind, digest, actual), actual


def _digest_matches(kind: str, expected: str, actual: str) -> bool:
    return actual.startswith(expected) if kind == "sha256-prefix" else actual == expected


def _digests(path: Path, chunk: int = 1 << 20) -> dict[str, str]:
    """{"md5", "sha256"} hex digests of the file at `path`, in one read."""
    digests = {"md5": hashlib.md5(usedforsecurity=False), "sha256": hashlib.sha256()}
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            for digest in digests.values():
                digest.update(block)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def _check_both(path: Path, kind: str, expected: str, recorded: str) -> tuple[str | None, str | None, str]:
    """A weakly pinned file against its weak checksum and its recorded sha256: (the weak digest it has where that
    does not match, else None; its sha256 where that is not the recorded one, else None; its sha256)."""
    have = _digests(path)
    weak = have["md5" if kind == "md5" else "sha256"]
    return (
        None if _digest_matches(kind, expected, weak) else weak,
        None if have["sha256"] == recorded else have["sha256"],
        have["sha256"],
    )


def fetch(
    url: str,
    dest: str | Path,
    sha256: str,
    *,
    retries: int = 3,
    backoff_s: float = 1.0,
    timeout_s: float = 60.0,
    progress: bool | None = None,
    recorded_sha256: str | None = None,
    lock: str = "the lock file",
) -> Path:
    """Download `url` to `dest` unless `dest` already has the checksum `sha256` (a sha256, or a labelled md5 or
    sha256 prefix: see `parse_checksum`); return `dest`.

    `retries` is the number of attempts after the first one; after failed attempt `k` (from 0)
    the wait is `backoff_s * 2**k`. `timeout_s` bounds each socket operation. The progress bar
    goes to stderr when it is a terminal, or as `progress` says when given. `recorded_sha256` (with the
    `lock` file it comes from, for the message) is the sha256 recorded on the first download of a file pinned by an
    md5 or a prefix: the file must match both, or RecordedSha256Mismatch names both hashes.
    """
    kind, expected = parse_checksum(sha256)
    label = CHECKSUM_KINDS[kind][1]
    if recorded_sha256 is not None:
        recorded_sha256 = parse_checksum(recorded_sha256)[1]
        label = f"{label} and recorded sha256"
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    dest = Path(dest)
    if dest.is_file():
        if recorded_sha256 is None:
            present = _matches(dest, kind, expected)[0]
        else:
            present = _check_both(dest, kind, expected, recorded_sha256)[:2] == (None, None)
        if present:
            log.info("%s already present with the expected %s", dest, label)
            return dest
        log.warning("%s exists with a different %s; downloading it again", dest, label)

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    show_progress = sys.stderr.isatty() if progress is None else progress
    attempts = retries + 1
    last_error: _TransientError | None = None
    for attempt in range(attempts):
        try:
            _attempt_download(url, part, timeout_s, show_progress, f"{attempt + 1}/{attempts}")
            break
        except _TransientError as error:
            last_error = error
            if attempt + 1 < attempts:
                wait_s = backoff_s * 2**attempt
                log.warning(
                    "attempt %d/%d for %s failed: %s; retrying in %.2f s", attempt + 1, attempts, url, error, wait_s
                )
                time.sleep(wait_s)
            else:
                log.error("attempt %d/%d for %s failed: %s", attempt + 1, attempts, url, error)
    else:
        raise DownloadError(f"could not download {url} after {attempts} attempts; last error: {last_error}")

    if recorded_sha256 is not None:
        weak_wrong, sha_wrong, actual = _check_both(part, kind, expected, recorded_sha256)
        if sha_wrong is not None:
            part.unlink()
            dest.unlink(missing_ok=True)  # a copy already there failed the same check
            raise RecordedSha256Mismatch(url, dest, sha256, weak_wrong, recorded_sha256, actual, lock)
        ok, weak_actual = weak_wrong is None, weak_wrong  # the sha256 is the recorded one; the config's pin moved?
    else:
        ok, weak_actual = _matches(part, kind, expected)
    if not ok:
        part.unlink()
        raise ChecksumMismatch(url, dest, expected, weak_actual, kind)
    os.replace(part, dest)
    log.info("downloaded %s to %s (%s verified)", url, dest, label)
    return dest


def _attempt_download(url: str, part: Path, timeout_s: float, show_progress: bool, attempt_label: str) -> None:
    """One GET of `url` into `part`, resuming from the bytes already there.

    Returns when the body is complete; raises _TransientError for failures worth retrying and
    DownloadError for those that are not.
    """
    offset = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": _USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    log.info("GET %s (attempt %s%s)", url, attempt_label, f", resuming at byte {offset}" if offset else "")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            offset = _resume_offset(response, offset, part)
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length is not None and length.isdigit() else None
            received = _copy_body(response, part, offset, total, show_progress)
    except urllib.error.HTTPError as error:
        error.close()
        if error.code == 416 and offset:
            part.unlink()
            raise _TransientError(f"HTTP 416 for a resume at byte {offset}; partial file discarded") from error
        if error.code == 429 or error.code >= 500:
            raise _TransientError(f"HTTP {error.code} {error.reason}") from error
        raise DownloadError(f"HTTP {error.code} {error.reason} for {url}") from error
    except _NETWORK_ERRORS as error:
        raise _TransientError(f"{type(error).__name__}: {error}") from error
    if total is not None and received < total:
        raise _TransientError(f"connection closed after {received} of {total} bytes")


def _resume_offset(response: http.client.HTTPResponse, offset: int, part: Path) -> int:
    """Where the response body starts in the file: `offset` for a matching 206, else 0."""
    if not offset:
        return 0
    if response.status != 206:
        log.info("server answered %s to a Range request; restarting from byte 0", response.status)
        return 0
    match = _CONTENT_RANGE_START.match(response.headers.get("Content-Range", ""))
    if match is None or int(match.group(1)) != offset:
        part.unlink()
        raise _TransientError(
            f"206 response with Content-Range {response.headers.get('Content-Range')!r} "
            f"for a resume at byte {offset}; partial file discarded"
        )
    return offset


def _copy_body(
    response: http.client.HTTPResponse, part: Path, offset: int, total: int | None, show_progress: bool
) -> int:
    """Write the body into `part`, appended after its first `offset` bytes; return the new size."""
    received = offset
    with (
        open(part, "ab" if offset else "wb") as out,
        tqdm(
            total=total,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=part.name.removesuffix(".part"),
            disable=not show_progress,
        ) as bar,
    ):
        while chunk := response.read(_READ_CHUNK):
            out.write(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    return received


PIN_ENV = "PAPERFLOW_PIN"  # comma-separated slugs whose unpinned downloads are fetched and pinned (paperflow pin)


def lock_path(slug: str, root: str | Path | None = None) -> Path:
    """`<root>/config/locks/<slug>.json`, the paper's lock file (root: the project's)."""
    if root is None:
        from paperflow.core.config import repo_root  # noqa: PLC0415

        root = repo_root()
    return Path(root) / "config" / "locks" / f"{slug}.json"


def _read_lock_doc(slug: str, root: str | Path | None) -> dict:
    import json

    path = lock_path(slug, root)
    return json.loads(path.read_text()) if path.is_file() else {}


def read_lock(slug: str, root: str | Path | None = None) -> dict[str, dict]:
    """{url: {"sha256", "bytes", "pinned_utc"}} of the paper's lock file ({} when it has none)."""
    return _read_lock_doc(slug, root).get("files", {})


def read_lock_revisions(slug: str, root: str | Path | None = None) -> dict[str, dict]:
    """{"<repo_type>:<repo id>": {"revision", "pinned_utc"}}: the Hub commits `paperflow pin` resolved for the paper."""
    return _read_lock_doc(slug, root).get("revisions", {})


def _write_lock(
    slug: str,
    root: str | Path | None,
    files: dict | None = None,
    revisions: dict | None = None,
    keep: set[str] | None = None,
) -> None:
    """Merge entries into the lock file under an exclusive flock of a sidecar file: two download jobs of one
    `paperflow pin` run write it at once, and each read-modify-write must see the other's entries. A file entry
    whose URL is in `keep` and is already there is kept as it is, and with another sha256 raises _AlreadyRecorded."""
    import fcntl

    path = lock_path(slug, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".flock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        _merge_lock(slug, root, path, files, revisions, keep or set())


def _merge_lock(
    slug: str,
    root: str | Path | None,
    path: Path,
    files: dict | None,
    revisions: dict | None,
    keep: set[str] = frozenset(),
) -> None:
    import json

    doc = _read_lock_doc(slug, root)
    for url in keep & set(files or {}):
        there = doc.get("files", {}).get(url, {}).get("sha256")
        if there and there != files[url]["sha256"]:
            raise _AlreadyRecorded(there)
        if there:
            files = {**files, url: doc["files"][url]}
    doc["comment"] = (
        f"sha256 of {slug}'s paper-scale files without a published checksum, and the Hub commits of its models and "
        f"datasets named without one, written by `paperflow pin {slug}`; and the sha256 of its files pinned only by "
        "a publisher's md5 or a sha256 prefix, recorded on their first download (`first_checked_with`). The download "
        "rules verify against it. Commit this file."
    )
    for section, new in (("files", files), ("revisions", revisions)):
        merged = {**doc.get(section, {}), **(new or {})}
        if merged:
            doc[section] = dict(sorted(merged.items()))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def _write_lock_entry(slug: str, url: str, entry: dict, root: str | Path | None) -> None:
    _write_lock(slug, root, files={url: entry})


def pinned_fetch(
    url: str,
    dest: str | Path,
    sha256: str | None,
    *,
    slug: str,
    key: str,
    root: str | Path | None = None,
    **fetch_kw,
) -> Path:
    """`fetch` with the sha256 from the config (`sha256`, named `key` there) or else from the paper's lock file.
    Neither: under `paperflow pin` (PAPERFLOW_PIN naming the slug) the file is downloaded, its sha256 written to
    the lock file and the file kept; otherwise UnpinnedDownload names the command. An existing pin is never
    rewritten: a file that changed on the server after pinning is refused as a ChecksumMismatch.

    A config checksum that is only an md5 or a sha256 prefix is made strong: the first download (checked against
    it) records the file's sha256 in the lock file, and every later one must match both (RecordedSha256Mismatch
    names the file, both hashes and what to do)."""
    if sha256:
        if parse_checksum(sha256)[0] != "sha256":
            return _strengthened_fetch(url, dest, sha256, slug=slug, root=root, **fetch_kw)
        return fetch(url, dest, sha256, **fetch_kw)
    locked = read_lock(slug, root).get(url)
    if locked:
        return fetch(url, dest, locked["sha256"], **fetch_kw)
    if slug in {s.strip() for s in os.environ.get(PIN_ENV, "").split(",")}:
        from datetime import datetime

        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".pin")
        _download_unverified(url, part, **fetch_kw)
        digest = sha256_file(part)
        os.replace(part, dest)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _write_lock_entry(slug, url, {"sha256": digest, "bytes": dest.stat().st_size, "pinned_utc": stamp}, root)
        log.info("pinned %s: sha256 %s written to %s", url, digest, lock_path(slug, root))
        return dest
    raise UnpinnedDownload(
        f"{key} is not set and config/locks/{slug}.json has no sha256 for {url}: paperflow never downloads unpinned "
        "data. On a machine with network, run "
        f"`paperflow pin {slug}` once (it downloads the paper's unpinned files, computes their sha256 and writes "
        f"config/locks/{slug}.json; commit that file), or set "
        f"{key} in config/{slug}.yaml to the checksum its publisher gives (`sha256sum` of a trusted copy)"
    )


def _strengthened_fetch(
    url: str, dest: str | Path, pin: str, *, slug: str, root: str | Path | None, **fetch_kw
) -> Path:
    """`fetch` of a file the config pins by an md5 or a sha256 prefix: against that and the sha256 the lock file
    records for `url`, or, on the first download, against that alone, its sha256 then recorded."""
    from datetime import datetime

    lock = str(lock_path(slug, root))
    recorded = read_lock(slug, root).get(url, {}).get("sha256")
    if recorded:
        return fetch(url, dest, pin, recorded_sha256=recorded, lock=lock, **fetch_kw)
    path = fetch(url, dest, pin, **fetch_kw)
    digest = sha256_file(path)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = {"sha256": digest, "bytes": path.stat().st_size, "pinned_utc": stamp, "first_checked_with": pin}
    try:
        _write_lock(slug, root, files={url: entry}, keep={url})
    except _AlreadyRecorded as error:  # another job recorded other bytes for `url` meanwhile
        path.unlink(missing_ok=True)
        raise RecordedSha256Mismatch(url, path, pin, None, error.sha256, digest, lock) from None
    log.info("recorded the sha256 %s of %s (first checked by %s) in %s", digest, url, pin, lock)
    return path


def require_sha256(
    path: str | Path, *, slug: str, sha256: str | None = None, key: str | None = None, root: str | Path | None = None
) -> str:
    """The guard before loading a pickle (or a `torch.load` without `weights_only=True`, an `np.load` with
    `allow_pickle=True`) from a downloaded file: its sha256, when that is `sha256` (the config's checksum, where it is
    a full sha256) or one the paper's lock file holds (pinned by `paperflow pin`, or recorded by `pinned_fetch` on
    the first download of a file pinned by an md5 or a prefix); otherwise WeakPinError, one line naming the file and
    what to do. An md5 or a prefix alone never passes: unpickling runs whatever code the file holds."""
    path = Path(path)
    if not path.is_file():
        raise WeakPinError(f"{path}: no such file, so it cannot be checked before unpickling; download it again")
    actual = sha256_file(path)
    if sha256:
        kind, digest = parse_checksum(sha256)
        if kind == "sha256" and digest == actual:
            return actual
    if any(entry.get("sha256") == actual for entry in read_lock(slug, root).values()):
        return actual
    setting = f"set {key} to its sha256, or " if key else ""
    raise WeakPinError(
        f"{path}: refusing to unpickle a file whose sha256 ({actual}) is neither pinned in the config nor recorded in "
        f"{lock_path(slug, root)} (an md5 or a sha256 prefix alone does not guard code that runs on loading): "
        f"{setting}download it through paperflow's pinned download (`paperflow pin {slug}` on a machine with "
        "network), which records its sha256; if it is recorded there with another sha256, the file changed since: "
        "delete it and download it again"
    )


def _download_unverified(url: str, part: Path, retries: int = 3, backoff_s: float = 1.0, timeout_s: float = 60.0,
                         progress: bool | None = None) -> None:  # fmt: skip
    """The transfer of `fetch` (retries, resumption) without a checksum to check: only `paperflow pin` uses it."""
    show_progress = sys.stderr.isatty() if progress is None else progress
    attempts = retries + 1
    for attempt in range(attempts):
        try:
            _attempt_download(url, part, timeout_s, show_progress, f"{attempt + 1}/{attempts}")
            return
        except _TransientError as error:
            if attempt + 1 == attempts:
                raise DownloadError(
                    f"could not download {url} after {attempts} attempts; last error: {error}"
                ) from error
            time.sleep(backoff_s * 2**attempt)


def _git(*args: str, cwd: str | Path | None = None) -> str:
    import subprocess

    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


def git_checkout(url: str, commit: str, folder: str | Path, key: str) -> Path:
    """The repository at `url` at exactly `commit` (40 hex, named `key` in the config) in `folder`, by a shallow
    fetch of that commit: a commit id is content-addressed, so the files are the ones it names (a branch or tag is
    refused, it moves). A folder already at that commit is kept; another is replaced. Used for the official code
    that paper-scale rules run (itpo's and eapo's verl recipes, LUFFY)."""
    import shutil

    if not re.fullmatch(r"[0-9a-f]{40}", str(commit)):
        raise ConfigError(f"{key} = {commit!r} is not a 40-hex git commit (a branch or tag moves)")
    folder = Path(folder)
    if (folder / ".git").is_dir() and _git("rev-parse", "HEAD", cwd=folder) == commit:
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _git("init", "-q", str(folder))
    _git("fetch", "-q", "--depth", "1", url, commit, cwd=folder)
    _git("-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD", cwd=folder)
    head = _git("rev-parse", "HEAD", cwd=folder)
    if head != commit:
        raise RuntimeError(f"{url}: fetched {head}, expected {commit} ({key})")
    return folder
