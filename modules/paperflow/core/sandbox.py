"""The one sandbox for code that a model wrote (promptscale's LiveCodeBench grading and code self-play today; any
paper that later runs generated code uses it). Standard library only.

run        one program: its files in a fresh tmpfs folder (nothing else of the host writable or visible but the
           system's and the interpreter's folders, read-only), its stdin, and back its status, stdout and stderr
isolation  "bwrap" (bubblewrap) or "rlimits" (the weaker fallback, accepted only when a config names it);
           `require(isolation, key)` refuses "bwrap" by name where bubblewrap is missing or cannot build its
           namespaces

With bwrap the program runs in new PID, network (loopback only), IPC, UTS, mount and cgroup namespaces
(`--unshare-all`), in a new session, with `--die-with-parent`, a cleared environment, a fresh /proc and a minimal
/dev, and / holding only /usr (and the /bin, /lib* links or folders), a few files of /etc, the Python prefixes
(the venv and its base interpreter) read-only, and two small tmpfs folders, the working folder /sandbox and /tmp.
Run as an ordinary user, bubblewrap also gives it a new user namespace (and forbids nested ones where bubblewrap
can); run as root, bubblewrap mounts without one and the program runs as a high uid that owns nothing on the host
(`sandbox_uid`), so that its process limit is enforced (root is exempt from RLIMIT_NPROC). Inside, a launcher sets
the rlimits (CPU seconds, address space, processes, file size, open files, no core dumps), closes every inherited
descriptor and execs the program. The parent reads stdout and stderr as they come, stops at `output_bytes`, and
kills the sandbox's process group at the wall-clock timeout: bubblewrap's init is PID 1 of the namespace, so every
process the program started (a `setsid` grandchild included) dies with it. Nothing here waits without a deadline.

With rlimits the program runs as the grader's user in a temporary folder, with the same rlimits, environment,
output cap and timeout (its process group killed): no filesystem, process or network isolation, and a process
that leaves the group (setsid) outlives the test; RLIMIT_NPROC does not bind root.
"""

from __future__ import annotations

import functools
import itertools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ISOLATIONS = ("bwrap", "rlimits")
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")
WORKDIR = "/sandbox"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "HOME": "/tmp"}
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives", "nsswitch.conf")
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
UID_BASE = 1_900_000_000  # root mode: the program's uid is UID_BASE + a slot (no host file is owned by one)
GRACE_S = 2.0  # after a kill, how long to wait for the process to be reaped before giving up on it

# Runs inside the sandbox before the program: rlimits, every descriptor above 2 closed, the uid dropped (root mode).
LAUNCHER = """import os, resource, sys
cpu, mem, nproc, fsize, nofile, uid = map(int, sys.argv[1:7])
os.closerange(3, 1 << 20)
if uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
for name, value in (("CPU", (cpu, cpu + 1)), ("AS", (mem, mem)), ("NPROC", (nproc, nproc)), ("FSIZE", (fsize, fsize)),
                    ("NOFILE", (nofile, nofile)), ("CORE", (0, 0))):
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), value)
os.execv(sys.argv[8], sys.argv[8:])
"""


class SandboxUnavailable(RuntimeError):
    """The isolation a config asks for cannot be had on this machine."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float  # wall clock; CPU seconds are ceil(timeout_s) + 1
    memory_mb: int  # address space of each process
    processes: int = 64  # RLIMIT_NPROC (with bwrap: of this sandbox alone)
    file_mb: int = 64  # RLIMIT_FSIZE, and the size of each tmpfs folder
    open_files: int = 256
    output_bytes: int = 32 << 20  # stdout and stderr together


@dataclass(frozen=True)
class Result:
    status: str  # one of STATUSES
    returncode: int | None
    stdout: bytes
    stderr: bytes
    isolation: str
    wall_s: float

    @property
    def text(self) -> str:
        """stdout as text; bytes that are not UTF-8 become U+FFFD (never an exception)."""
        return self.stdout.decode("utf-8", "replace")


def python_prefixes() -> list[str]:
    """The folders the running interpreter needs: its prefix (a venv) and its base installation."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    found.add(str(Path(os.path.realpath(sys.executable)).parents[1]))
    return sorted(p for p in found if p and os.path.isdir(p) and p != "/")


@functools.lru_cache(maxsize=1)
def _bwrap_features() -> frozenset[str]:
    try:
        text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(w for w in ("--disable-userns", "--size", "--perms") if w in text)


_slots = itertools.count()


def sandbox_uid() -> int:
    """Root mode: a high uid for one sandbox (distinct for concurrent sandboxes of one process)."""
    return UID_BASE + (os.getpid() % 10_000) * 10_000 + next(_slots) % 10_000


def _bwrap_argv(files: Sequence[tuple[int, str]], limits: Limits, ro_paths: Sequence[str], root: bool) -> list[str]:
    size = str(limits.file_mb << 20)
    argv = ["bwrap", "--die-with-parent", "--new-session", "--clearenv"]
    if root:  # bubblewrap mounts with root's capabilities; the launcher drops to sandbox_uid
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all", "--unshare-user"]
        if "--disable-userns" in _bwrap_features():
            argv += ["--disable-userns"]
    for key, value in ENV.items():
        argv += ["--setenv", key, value]
    argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_LINKS:
        path = f"/{name}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    binds = [p for p in sorted(set(ro_paths), key=len) if not p.startswith("/usr/")]
    folders = {"/etc"} | {str(a) for p in binds for a in Path(p).parents if str(a) != "/"}
    for folder in sorted(folders, key=len):  # made by bubblewrap as root they would be 0700: the uid could not pass
        argv += ["--perms", "0755", "--dir", folder]
    for name in ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for path in binds:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    argv += ["--perms", "1777", "--size", size, "--tmpfs", WORKDIR]
    for fd, name in files:
        argv += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
    return argv + ["--chdir", WORKDIR]


def _launcher(limits: Limits, uid: int, argv: Sequence[str]) -> list[str]:
    cpu = int(limits.timeout_s) + 1
    numbers = [cpu, limits.memory_mb << 20, limits.processes, limits.file_mb << 20, limits.open_files, uid]
    return [argv[0], "-I", "-S", "-c", LAUNCHER, *map(str, numbers), "--", *argv]


def run(
    argv: Sequence[str],
    files: Mapping[str, str | bytes],
    stdin: str | bytes,
    limits: Limits,
    isolation: str,
    ro_paths: Sequence[str] | None = None,
) -> Result:
    """Run `argv` (argv[0] a Python interpreter: it also runs the launcher) in a folder holding only `files` ({name:
    content}), `stdin` on its standard input. `ro_paths` are the host folders it may read besides the system's (the
    running interpreter's prefixes when None)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox isolation {isolation!r}: allowed {ISOLATIONS}")
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"sandbox file name {name!r}: a plain name")
    data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    blobs = {k: v.encode() if isinstance(v, str) else bytes(v) for k, v in files.items()}
    start = time.monotonic()
    fds: list[int] = []
    folder = None
    try:
        if isolation == "bwrap":
            root = os.geteuid() == 0
            for name, blob in blobs.items():
                fd = os.memfd_create(f"sandbox-{name}")
                os.write(fd, blob)
                os.lseek(fd, 0, os.SEEK_SET)
                fds.append(fd)
            paths = python_prefixes() if ro_paths is None else list(ro_paths)
            cmd = _bwrap_argv(list(zip(fds, blobs)), limits, paths, root)
            cmd += ["--", *_launcher(limits, sandbox_uid() if root else -1, argv)]
            cwd = "/"
        else:
            folder = tempfile.mkdtemp(prefix="sandbox-")
            for name, blob in blobs.items():
                Path(folder, name).write_bytes(blob)
            cmd, cwd = _launcher(limits, -1, argv), folder
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(ENV),  # bubblewrap's own environment is what /proc/1/environ shows inside
            pass_fds=fds,
            start_new_session=True,  # one process group: the timeout kills bubblewrap (or the program) and its own
        )
    except BaseException:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    try:
        out, err, why = _pump(proc, data, start + float(limits.timeout_s), limits.output_bytes)
    finally:
        _kill(proc)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    return Result(
        _status(why, proc.returncode, err, isolation), proc.returncode, out, err, isolation, time.monotonic() - start
    )


def _pump(proc: subprocess.Popen, data: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Feed stdin and read stdout and stderr until both close, the deadline passes ("timeout") or more than `cap`
    bytes came ("output_limit"). Once the process has exited, open pipes (a descendant holding them) get a short
    grace."""
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total, written, why, exited_at = 0, 0, None, None
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        stdin_fd = proc.stdin.fileno()
        if data:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while any(k.fd in chunks for k in sel.get_map().values()):
            now = time.monotonic()
            if now >= deadline:
                why = "timeout"
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break
            for key, _ in sel.select(min(deadline - now, 0.1)):
                if key.fd == stdin_fd:
                    try:
                        written += os.write(stdin_fd, data[written : written + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the program stopped reading: the rest is dropped
                        written = len(data)
                    if written >= len(data):
                        sel.unregister(stdin_fd)
                        proc.stdin.close()
                    continue
                try:
                    block = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not block:
                    sel.unregister(key.fd)
                    continue
                total += len(block)
                chunks[key.fd].append(block)
                if total > cap:
                    why = "output_limit"
                    break
            if why:
                break
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()]), why


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (bubblewrap, or the program and what stayed in its group), reap, close pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        try:
            pipe.close()
        except OSError:
            pass


def _status(why: str | None, rc: int | None, err: bytes, isolation: str) -> str:
    if why:
        return why
    if rc == 0:
        return "ok"
    # bubblewrap reports a signal as 128 + its number; without it Popen gives -number
    signum = -rc if rc is not None and rc < 0 else (rc - 128 if isolation == "bwrap" and rc and rc > 128 else 0)
    if signum in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout"
    if b"MemoryError" in err[-4096:]:
        return "memory"
    return "error"


@functools.lru_cache(maxsize=4)
def unavailable(isolation: str = "bwrap") -> str | None:
    """Why `isolation` cannot run a trivial program here (None when it can); bwrap is tried once per process."""
    if isolation == "rlimits":
        return None
    if isolation != "bwrap":
        return f"unknown isolation {isolation!r} (allowed {ISOLATIONS})"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    missing = [f for f in ("--size", "--perms") if f not in _bwrap_features()]
    if missing:
        return f"this bubblewrap lacks {missing} (needs bubblewrap 0.5 or newer)"
    try:
        got = run([sys.executable, "-c", "print(6 * 7)"], {}, "", Limits(timeout_s=20, memory_mb=1024), "bwrap")
    except OSError as e:
        return f"bubblewrap does not start: {e}"
    if got.status != "ok" or got.text.strip() != "42":
        tail = got.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"status {got.status}"]
        return f"bubblewrap cannot build its sandbox here: {tail[0]}"
    return None


def require(isolation: str, key: str) -> str:
    """`isolation` when it works here; else SandboxUnavailable naming the config `key` and how to accept less."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"{key} = {isolation!r}: allowed {ISOLATIONS}")
    why = unavailable(isolation)
    if why:
        raise SandboxUnavailable(
            f"{key} = {isolation}: {why}. Install bubblewrap (with unprivileged user namespaces, or run as root), "
            f"or set {key}: rlimits to accept rlimits-only isolation (no filesystem, process or network isolation)"
        )
    return isolation
