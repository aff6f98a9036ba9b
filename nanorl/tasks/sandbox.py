"""Run untrusted (model-written) Python in a sandboxed subprocess, many at a time.

    result = run_python("print(1 + 1)", Limits(wall_s=5))      # Result(ok=True, stdout="2\\n", ...)
    results = run_many([code_a, code_b, ...], Limits())         # in parallel across cores

Each program gets: its own working directory, a clean environment (nothing inherited from the
trainer), limits on wall-clock and CPU time, address space, process count, file and output size,
and 64 open files; the whole process group (and, as root, every process of its private uid) is
killed when it ends or times out. As root (as on these machines) the program also runs as an
unprivileged uid of its own, in new network and mount namespaces: no network, and fresh tmpfs over
/tmp, /var/tmp, /dev/shm and /run/lock (the world-writable places) so nothing it writes reaches the host. As another user the network is
cut where the kernel allows unprivileged user namespaces; the uid is then the trainer's own.
Linux only (namespaces, rlimits); `nanorl/tasks/_sandbox_launch.py` does the set-up in the child.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = Path(__file__).with_name("_sandbox_launch.py")
UID_BASE = 61000  # sandbox uids 61000..61000+slots-1: unused by any account, one per concurrent program


@dataclass
class Limits:
    wall_s: float = 5.0  # wall-clock seconds
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU)
    memory_mb: int = 512  # address space (RLIMIT_AS)
    procs: int = 16  # processes and threads of the sandbox uid (RLIMIT_NPROC; effective for non-root uids)
    file_bytes: int = 1_000_000  # largest file it may write, stdout and stderr included (RLIMIT_FSIZE)


@dataclass
class Result:
    ok: bool  # exited 0 within every limit
    returncode: int | None
    stdout: str
    stderr: str
    reason: str  # "" when ok, else "timeout", "exit N", "signal NAME"
    nonce: str  # the secret the program's harness may print to prove it finished (see code.py)


_slots = threading.Semaphore(64)
_free = list(range(64))
_lock = threading.Lock()


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (escaped daemons included), from a child that becomes that uid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)  # as an unprivileged uid, -1 reaches only its own processes
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def run_python(code: str, limits: Limits | None = None) -> Result:
    """Run `code` as a Python program under `limits`; never raises for anything the program does."""
    limits = limits or Limits()
    if not sys.platform.startswith("linux"):
        raise RuntimeError("the code sandbox needs Linux (namespaces and resource limits)")
    root = os.geteuid() == 0
    with _slots:
        with _lock:
            slot = _free.pop()
        uid = UID_BASE + slot
        tmp = Path(tempfile.mkdtemp(prefix="nanorl-sbx-"))
        try:
            (tmp / "program.py").write_text(code)
            workdir = tmp / "work"
            workdir.mkdir()
            nonce = secrets.token_hex(16)
            cfg = {"program": str(tmp / "program.py"), "workdir": str(workdir), "uid": uid, "nonce": nonce,
                   "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "procs": limits.procs,
                   "file_bytes": limits.file_bytes}
            with open(tmp / "stdout", "wb+") as out, open(tmp / "stderr", "wb+") as err:
                proc = subprocess.Popen([sys.executable, "-I", str(LAUNCHER), json.dumps(cfg)], stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, cwd=tmp, env={"PATH": "/usr/bin:/bin"},
                                        start_new_session=True, close_fds=True)
                try:
                    rc, reason = proc.wait(timeout=limits.wall_s), ""
                except subprocess.TimeoutExpired:
                    rc, reason = None, "timeout"
                for kill in ([lambda: os.killpg(proc.pid, signal.SIGKILL)] +
                             ([lambda: _kill_uid(uid)] if root else [])):
                    try:
                        kill()
                    except (ProcessLookupError, PermissionError):
                        pass
                proc.wait()
                if rc is None:
                    rc = proc.returncode
                out.seek(0)
                err.seek(0)
                stdout = out.read(limits.file_bytes).decode("utf-8", "replace")
                stderr = err.read(limits.file_bytes).decode("utf-8", "replace")
            if not reason and rc != 0:
                reason = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
            return Result(not reason, rc, stdout, stderr, reason, nonce)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with _lock:
                _free.append(slot)


def run_many(programs: list[str], limits: Limits | None = None, workers: int | None = None) -> list[Result]:
    """run_python over many programs in parallel (threads waiting on subprocesses), in order."""
    workers = workers or max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda c: run_python(c, limits), programs))
