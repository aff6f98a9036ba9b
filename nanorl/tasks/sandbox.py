"""Run untrusted (model-written) Python in a sandboxed subprocess, many at a time.

    result = run_python("print(1 + 1)", Limits(wall_s=5))      # Result(ok=True, stdout="2\\n", ...)
    results = run_many([code_a, code_b, ...], Limits())         # in parallel across cores

Each program gets a clean environment, limits on wall-clock and CPU time, address space, process
count, file and output size and open files, no_new_privs and a seccomp filter (no ptrace, io_uring,
bpf, perf_event_open, keyrings, mounts or new namespaces). What it writes to file descriptor 3 comes
back as `Result.data` (the code reward's judge reads the test results there; see code.py).

As root (as on these machines) it also gets new mount, network, IPC, UTS and PID namespaces, a
minimal read-only root (/usr, the interpreter's prefix without site-packages, nothing of nanorl, the
checkout, the home folder or the run folder; fresh /proc, /tmp and /dev/shm), and a private uid
taken from a host-wide pool: a lock file per uid under LOCK_DIR, held until the program's last
process is gone, so two trainers on one host never share a uid. When the program ends or times out,
PID 1 of its namespace is killed and the kernel takes every process inside with it; its System V
IPC objects, mounts and network go with their namespaces.
As another user the same namespaces and minimal root are built inside a new user namespace (your uid
mapped to itself; the program's exec drops every capability): what differs is the uid, which is
yours, so RLIMIT_NPROC counts your processes in that namespace only and the private-uid pool is not
used. Where the kernel refuses unprivileged user namespaces (or one cannot be built, e.g. a container
that masks /proc), the program gets only the limits, the clean environment, no_new_privs and seccomp:
it runs as your uid, sees your files, and a daemon that calls setsid() can outlive it.
Linux only; `nanorl/tasks/_sandbox_launch.py` does the set-up in the child.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = Path(__file__).with_name("_sandbox_launch.py")
UID_BASE, UID_SLOTS = 61000, 1024  # sandbox uids 61000..62023: unused by any account, one per running program
LOCK_DIR = Path("/run/nanorl-sandbox") if Path("/run").is_dir() else Path(tempfile.gettempdir()) / "nanorl-sandbox"
HIDDEN = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]  # nanorl, its checkout


@dataclass
class Limits:
    wall_s: float = 5.0  # wall-clock seconds
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU)
    memory_mb: int = 512  # address space (RLIMIT_AS)
    procs: int = 16  # processes and threads of the sandbox uid (RLIMIT_NPROC; effective for non-root uids)
    file_bytes: int = 1_000_000  # largest file it may write, stdout, stderr and data included (RLIMIT_FSIZE)
    tmp_mb: int = 64  # size of each of its tmpfs, /tmp and /dev/shm (as root)


@dataclass
class Result:
    ok: bool  # exited 0 within every limit
    returncode: int | None
    stdout: str
    stderr: str
    reason: str  # "" when ok, else "timeout", "exit N", "signal NAME"
    data: bytes = b""  # what it wrote to file descriptor 3, at most file_bytes


class SandboxError(RuntimeError):
    """The sandbox could not be set up (not the program's doing)."""


_slots = threading.Semaphore(64)  # programs in flight from this process
USER_NAMESPACES = True  # as another user: build the sandbox in a user namespace (until one fails to build)


def take_uid() -> tuple[int, int]:
    """-> (uid, the fd holding its lock file locked). Free slots are found by trying locks from a random start."""
    try:
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise SandboxError(f"the sandbox's uid locks need the folder {LOCK_DIR}: {e}") from None
    while True:
        start = random.randrange(UID_SLOTS)
        for i in range(UID_SLOTS):
            uid = UID_BASE + (start + i) % UID_SLOTS
            fd = os.open(LOCK_DIR / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # per open file: threads exclude each other too
                return uid, fd
            except BlockingIOError:
                os.close(fd)
        time.sleep(0.05)


def _reason(report: dict) -> tuple[int | None, str]:
    """The launcher's report -> (returncode, reason)."""
    if report.get("timeout"):
        return None, "timeout"
    rc = os.waitstatus_to_exitcode(report["status"])
    if rc == 0:
        return 0, ""
    return rc, f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"


def run_python(code: str, limits: Limits | None = None) -> Result:
    """Run `code` as a Python program under `limits`; never raises for anything the program does (a sandbox
    that cannot be set up raises SandboxError). As another user, a user namespace that cannot be built (a
    container that masks /proc, say) is tried once, then the rest of the process runs without one."""
    global USER_NAMESPACES
    limits = limits or Limits()
    if not sys.platform.startswith("linux"):
        raise RuntimeError("the code sandbox needs Linux (namespaces and resource limits)")
    if os.geteuid() != 0 and USER_NAMESPACES:
        try:
            return _run(code, limits, userns=True)
        except SandboxError as e:
            USER_NAMESPACES = False
            warnings.warn(f"the code sandbox runs without namespaces from now on: {e}", stacklevel=2)
    return _run(code, limits, userns=False)


def _run(code: str, limits: Limits, userns: bool) -> Result:
    root = os.geteuid() == 0
    with _slots:
        uid, lock = take_uid() if root else (os.geteuid(), None)
        tmp = Path(tempfile.mkdtemp(prefix="nanorl-sbx-"))
        try:
            (tmp / "program.py").write_text(code)
            (tmp / "work").mkdir()
            (tmp / "root").mkdir()
            cfg = {
                "program": str(tmp / "program.py"),
                "workdir": str(tmp / "work"),
                "root": str(tmp / "root"),
                "data": str(tmp / "data"),
                "status": str(tmp / "status"),
                "uid": uid,
                "hide": HIDDEN,
                "userns": userns,
                "wall_s": limits.wall_s,
                "cpu_s": limits.cpu_s,
                "memory_mb": limits.memory_mb,
                "procs": limits.procs,
                "file_bytes": limits.file_bytes,
                "tmp_mb": limits.tmp_mb,
            }
            with open(tmp / "stdout", "wb+") as out, open(tmp / "stderr", "wb+") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=tmp,
                    env={"PATH": "/usr/bin:/bin"},
                    start_new_session=True,
                    pass_fds=() if lock is None else (lock,),
                )
                try:
                    proc.wait(timeout=limits.wall_s + 10)  # the launcher keeps the wall clock; this is a backstop
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # as another user: the program's process group
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
                out.seek(0)
                err.seek(0)
                stdout = out.read(limits.file_bytes).decode("utf-8", "replace")
                stderr = err.read(limits.file_bytes).decode("utf-8", "replace")
            try:
                report = json.loads((tmp / "status").read_text())
            except (OSError, ValueError):
                report = (
                    {"timeout": True}
                    if proc.returncode == -signal.SIGKILL
                    else {"error": f"the sandbox launcher failed (exit {proc.returncode}): {stderr[-2000:]}"}
                )
            if "error" in report:
                raise SandboxError(report["error"])
            rc, reason = _reason(report)
            data = (tmp / "data").read_bytes()[: limits.file_bytes] if (tmp / "data").is_file() else b""
            return Result(not reason, rc, stdout, stderr, reason, data)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if lock is not None:
                os.close(lock)


def run_many(programs: list[str], limits: Limits | None = None, workers: int | None = None) -> list[Result]:
    """run_python over many programs in parallel (threads waiting on subprocesses), in order."""
    workers = workers or max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda c: run_python(c, limits), programs))
