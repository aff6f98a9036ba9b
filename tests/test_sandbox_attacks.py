"""Issue 20's attack classes against the code sandbox, one or more cases each. Every attack must score 0
(or find nothing), finish within its limits, and leave the host as it was: no new processes, mounts,
System V IPC objects or files. Canaries only: each test makes its own segment, socket, process or
file and removes it; no real host file or process is touched.

Root only (these machines, CI): as another user the sandbox has no namespaces to build (see sandbox.py).
"""

import ast
import ctypes
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nanorl.tasks import Example, Task, sandbox
from nanorl.tasks.code import code_reward
from nanorl.tasks.sandbox import LOCK_DIR, UID_BASE, UID_SLOTS, Limits, run_python

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0, reason="the isolation under attack needs Linux and root"
)
FAST = Limits(wall_s=5.0, cpu_s=5, memory_mb=256, procs=16, file_bytes=100_000)
TESTS = [{"call": "f(2)", "expected": "4"}, {"call": "f(3)", "expected": "9"}]
IPC_CREAT, IPC_RMID = 0o1000, 0
libc = ctypes.CDLL(None, use_errno=True)


def _host_state() -> dict:
    """What an attack must not change: mounts, System V IPC objects, sandbox-uid processes."""
    procs = []
    for d in Path("/proc").iterdir():
        try:
            status = (d / "status").read_text() if d.name.isdigit() else ""
            if (
                status
                and UID_BASE <= int(status.split("Uid:")[1].split()[0]) < UID_BASE + UID_SLOTS
                and status.split("State:")[1].split()[0] != "Z"
            ):
                procs.append(int(d.name))
        except (OSError, IndexError):
            continue
    return {
        "mounts": Path("/proc/self/mountinfo").read_text(),
        "shm": Path("/proc/sysvipc/shm").read_text(),
        "msg": Path("/proc/sysvipc/msg").read_text(),
        "sem": Path("/proc/sysvipc/sem").read_text(),
        "procs": procs,
    }


@pytest.fixture
def host():
    """Yields nothing; afterwards the host must look as before (processes get 5 s to be reaped)."""
    before = _host_state()
    yield
    deadline = time.time() + 5
    while _host_state()["procs"] and time.time() < deadline:
        time.sleep(0.1)
    after = _host_state()
    assert after["procs"] == []
    for key in ("mounts", "shm", "msg", "sem"):
        assert after[key] == before[key], key


def _score(body: str) -> float:
    """The reward of a hostile 'solution' of f(x) = x * x that runs `body` first and returns x * x only if the
    body's `ok` is true: so 0 means the attack found or did nothing. The body must run to its end (an attack
    that crashed would prove nothing)."""
    t0 = time.perf_counter()
    r = run_python(f"ok = False\n{body}\nprint('attack ran; ok =', ok)", FAST)
    assert "attack ran; ok = " in r.stdout, r.stdout + r.stderr
    reward = code_reward("", f"ok = False\n{body}\ndef f(x):\n    return x * x if ok else -1", tests=TESTS)
    assert time.perf_counter() - t0 < 2 * Limits().wall_s + 5
    return reward


# --- the judge runs where the program can reach it ---


def test_expected_answers_are_nowhere_in_the_sandbox(host):
    tests = [{"call": "f(2)", "expected": "987654321"}]
    body = (
        "import os, glob\nseen = ''\nfor p in ['main.py', '/proc/self/cmdline', '/proc/self/environ'] + "
        "glob.glob('/proc/*/cmdline') + glob.glob('/tmp/**', recursive=True):\n    try:\n"
        "        seen += open(p, 'rb').read().decode('latin1')\n    except OSError:\n        pass\n"
        "import gc\nseen += repr([o for o in gc.get_objects() if isinstance(o, (list, dict, tuple))][:100000])\n"
        "ok = ''.join(['98765', '4321']) in seen\n"
    )  # the needle exists only after the search
    reward = code_reward("", body + "def f(x):\n    return int(''.join(['98765', '4321'])) if ok else 0", tests=tests)
    assert reward == 0.0


def test_patched_builtins_and_exit_handlers_gain_nothing(host):
    for body in (
        "import builtins\nclass A:\n    __eq__ = lambda s, o: True\n    __hash__ = lambda s: 0\n"
        "builtins.eval = lambda *a, **k: A()\nbuiltins.isinstance = lambda *a: True",
        'import atexit, os\natexit.register(lambda: os.write(3, b\'[0, ["i", "4"]]\\n\'))',
        'import json\njson.dumps = lambda *a, **k: \'[0, ["i", "4"]]\'',
    ):
        assert _score(body) == 0.0, body


def test_forged_out_of_range_results_never_raise_into_the_loop(host):
    task = Task("code", train=[Example("p", {"tests": TESTS})], eval=[], reward=code_reward, on_error="raise")
    forged = [
        'import os\nos.write(3, b\'[0, ["i", "333333"]]\\n[1, ["f", "3e299"]]\\n\')\nos._exit(0)',
        "import os\nos.write(3, b'[0, \"lots\"]\\n')\nos._exit(0)",
        "import os\nos.write(3, b'\\xff' * 5000)",
    ]
    parts, total, errors = task.score_parts(task.train * 3, [f"```python\n{c}\n```" for c in forged])
    assert total == [0.0, 0.0, 0.0] and errors == 0


def test_the_task_file_checkout_home_and_run_folder_are_invisible(host, tmp_path):
    import nanorl

    name = f"nanorl-canary-{os.getpid()}"
    canaries = [tmp_path / name, Path.home() / name]  # the run folder (any folder of the trainer's), the home
    for c in canaries:
        c.write_text("canary")
    paths = [
        Path(nanorl.__file__).parent / "tasks" / "data" / "code_tasks.jsonl",
        Path(nanorl.__file__).parents[1] / "pyproject.toml",
        *canaries,
    ]
    body = (
        "import os\nok = any(os.path.exists(p) for p in %r)\nfor d, _, files in os.walk('/'):\n"
        "    if not d.startswith('/proc'):\n        ok = ok or bool({'code_tasks.jsonl', %r} & set(files))\n"
    ) % ([str(p) for p in paths], name)
    try:
        assert _score(body) == 0.0
    finally:
        for c in canaries:
            c.unlink()


# --- the sandbox shares too much with the host ---


def test_host_sysv_ipc_is_unreachable_and_the_programs_own_is_freed(host):
    key = 0x4E52_0000 + os.getpid() % 0xFFFF
    shmid = libc.shmget(key, 4096, IPC_CREAT | 0o666)
    msqid = libc.msgget(key, IPC_CREAT | 0o666)
    assert shmid >= 0 and msqid >= 0
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, b"canary", 6)
    try:
        body = (
            f"import ctypes\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
            f"ok = [libc.shmget({key}, 0, 0), libc.msgget({key}, 0)] != [-1, -1]\n"
            f"ok = ok or libc.shmat({shmid}, None, 0) not in (None, 2**64 - 1)\n"
            "ok = ok or len(open('/proc/sysvipc/shm').readlines()) > 1\n"
            "for _ in range(8):  # left behind on purpose: 128 MiB that must not outlive the program\n"
            "    libc.shmget(0, 16 << 20, 0o1000 | 0o666)\n    libc.msgget(0, 0o1000 | 0o666)\n"
        )
        assert _score(body) == 0.0  # and the host fixture checks that its 8 segments and queues are gone
        assert ctypes.string_at(addr, 6) == b"canary"
    finally:
        libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(shmid, IPC_RMID, None)
        libc.msgctl(msqid, IPC_RMID, None)


def test_host_unix_sockets_are_unreachable(host, tmp_path):
    servers, hits = [], []
    for address in (str(tmp_path / "canary.sock"), f"\0nanorl-canary-{os.getpid()}"):
        s = socket.socket(socket.AF_UNIX)
        s.bind(address)
        s.listen(1)
        s.settimeout(3)
        servers.append(s)
        threading.Thread(target=lambda s=s: hits.append(_accept(s)), daemon=True).start()
    body = (
        "import socket\nfor a in %r:\n    try:\n        c = socket.socket(socket.AF_UNIX)\n        c.connect(a)\n"
        "        c.sendall(b'pwned')\n        ok = True\n    except OSError:\n        pass\n"
    ) % [str(tmp_path / "canary.sock"), f"\0nanorl-canary-{os.getpid()}"]
    try:
        assert _score(body) == 0.0
        time.sleep(0.3)
        assert all(h is None for h in hits)
    finally:
        for s in servers:
            s.close()


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


def test_host_processes_are_invisible(host):
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "nanorl-canary-secret"])
    try:
        body = (
            "import glob\nseen = ''\nfor p in glob.glob('/proc/[0-9]*/cmdline'):\n    try:\n"
            "        seen += open(p, 'rb').read().decode('latin1')\n    except OSError:\n        pass\n"
            "ok = 'nanorl-canary-secret' in seen or len(glob.glob('/proc/[0-9]*')) > 5\n"
            f"import os\nfor pid in ({canary.pid}, {os.getpid()}):\n    try:\n        os.kill(pid, 9)\n"
            "        ok = True\n    except OSError:\n        pass\n"
        )
        assert _score(body) == 0.0
        assert canary.poll() is None  # still alive
    finally:
        canary.kill()
        canary.wait()


def test_signals_to_the_sandbox_init_change_nothing(host):
    body = (
        "import os, signal\nfor sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP):\n"
        "    os.kill(1, sig)\nimport time\ntime.sleep(0.3)\n"
    )
    assert _score(body) == 0.0  # and the program lived on to its end (PID 1 ignored them)


def test_detached_daemons_die_with_the_program(host, tmp_path):
    # double fork + setsid, then the program exits: the daemon must be gone (the host fixture checks it)
    body = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
        "    os._exit(0)\ntime.sleep(0.2)\n"
    )
    assert _score(body) == 0.0


def test_kernel_interfaces_are_refused(host):
    body = """import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(nr, *args):
    r = libc.syscall(nr, *args)
    return 0 if r >= 0 else ctypes.get_errno()
import platform
X86 = platform.machine() == 'x86_64'
calls = {'add_key': 248 if X86 else 217, 'keyctl': 250 if X86 else 219, 'io_uring_setup': 425,
         'bpf': 321 if X86 else 280, 'perf_event_open': 298 if X86 else 241, 'unshare': 272 if X86 else 97,
         'ptrace': 101 if X86 else 117, 'userfaultfd': 323 if X86 else 282, 'mount': 165 if X86 else 40}
refused = {name: errno_of(nr, 0, 0, 0, 0, 0) for name, nr in calls.items()}
refused['unshare'] = errno_of(calls['unshare'], 0x10000000)  # CLONE_NEWUSER
status = open('/proc/self/status').read()
t = threading.Thread(target=lambda: None)
t.start()
t.join()
ok = not (all(e == 1 for e in refused.values()) and 'NoNewPrivs:\\t1' in status and 'Seccomp:\\t2' in status)
print(refused, ok)
"""
    assert _score(body) == 0.0


def test_two_trainers_never_share_a_uid(host, tmp_path, monkeypatch):
    """Two processes, each running programs on a pool of two uids: a uid is never held by two programs at once."""
    here = Path(__file__).parents[1] / "nanorl" / "tasks" / "sandbox.py"
    script = tmp_path / "trainer.py"
    script.write_text(f"""import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sbx", {str(here)!r})
sbx = sys.modules["sbx"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sbx)
sbx.UID_SLOTS = 2
prog = "import os, time\\nt0 = time.time()\\ntime.sleep(0.4)\\nprint(os.getuid(), t0, time.time())"
print(json.dumps([r.stdout for r in sbx.run_many([prog] * 3, workers=2)]))
""")
    other = subprocess.Popen([sys.executable, "-I", str(script)], stdout=subprocess.PIPE, text=True)
    monkeypatch.setattr(sandbox, "UID_SLOTS", 2)
    prog = "import os, time\nt0 = time.time()\ntime.sleep(0.4)\nprint(os.getuid(), t0, time.time())"
    outs = [r.stdout for r in sandbox.run_many([prog] * 3, workers=2)]
    theirs, _ = other.communicate(timeout=60)
    runs = [tuple(map(float, o.split())) for o in outs + json.loads(theirs)]
    assert len(runs) == 6 and {int(u) for u, _, _ in runs} <= {UID_BASE, UID_BASE + 1}
    for i, (u, a, b) in enumerate(runs):
        for v, c, d in runs[i + 1 :]:
            assert u != v or b <= c or d <= a, "two programs ran under one uid at once"
    for uid in (UID_BASE, UID_BASE + 1):  # and the locks are free again
        with open(LOCK_DIR / f"uid-{uid}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_hostname_and_network_are_private(host):
    body = (
        "import socket\nok = socket.gethostname() == %r or len(socket.if_nameindex()) > 1\n"
        "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n    ok = True\nexcept OSError:\n"
        "    pass\n"
    ) % socket.gethostname()
    assert _score(body) == 0.0


def test_a_good_program_still_passes_with_threads_and_subprocesses(host):
    body = (
        "import threading, subprocess, sys, tempfile\nt = threading.Thread(target=lambda: None)\nt.start()\n"
        "t.join()\nok = subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True).stdout == b'1\\n'\n"
        "with tempfile.TemporaryFile() as f:\n    ok = ok and f.write(b'x') == 1\n"
    )
    assert _score(body) == 1.0
    assert run_python("print(open('/dev/urandom', 'rb').read(4).__len__())", FAST).stdout == "4\n"


NOBODY_PROBE = r'''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sbx", sys.argv[1])
sbx = sys.modules["sbx"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sbx)
probe = """
import glob, os, socket, subprocess, sys, threading
t = threading.Thread(target=lambda: None)
t.start()
t.join()
status = open('/proc/self/status').read()
print(repr({"root": sorted(os.listdir('/')), "pids": len(glob.glob('/proc/[0-9]*')), "host": socket.gethostname(),
            "nnp": 'NoNewPrivs:\\t1' in status, "seccomp": 'Seccomp:\\t2' in status,
            "caps": status.split('CapEff:')[1].split()[0], "trainer_folder": os.path.exists(%r),
            "child": subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True).stdout}))
if os.fork() == 0:
    os.setsid()
    os.execv('/bin/sleep', ['nanorl-daemon-canary', '60'])
""" % sys.argv[2]
r = sbx.run_python(probe, sbx.Limits(wall_s=10))
print(json.dumps({"namespaces": sbx.USER_NAMESPACES, "ok": r.ok, "stdout": r.stdout, "stderr": r.stderr}))
'''


def test_as_another_user_the_sandbox_is_built_in_a_user_namespace(host, tmp_path):
    """Run as `nobody` (setpriv) with the system Python: the same minimal root, PID namespace, hostname,
    no_new_privs, seccomp and no capabilities, and a detached daemon dies with the program."""
    import shutil
    import tempfile

    python = "/usr/bin/python3"
    if not (shutil.which("setpriv") and os.path.exists(python)):
        pytest.skip("needs setpriv and a system Python that another user can run")
    folder = Path(tempfile.mkdtemp(prefix="nanorl-nobody-"))
    try:
        folder.chmod(0o755)
        for name in ("sandbox.py", "_sandbox_launch.py"):
            shutil.copy(Path(sandbox.__file__).with_name(name), folder / name)
        (folder / "probe.py").write_text(NOBODY_PROBE)
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                python,
                "-I",
                str(folder / "probe.py"),
                str(folder / "sandbox.py"),
                str(folder / "probe.py"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=folder,
        )
        if "namespaces" not in done.stdout:
            pytest.skip(f"cannot run the sandbox as nobody here: {done.stderr[-300:]}")
        out = json.loads(done.stdout)
        if not out["namespaces"]:
            pytest.skip("this kernel refuses unprivileged user namespaces")
        assert out["ok"], out["stderr"]
        seen = ast.literal_eval(out["stdout"])
        assert set(seen["root"]) <= {
            "bin",
            "dev",
            "etc",
            "lib",
            "lib32",
            "lib64",
            "libx32",
            "proc",
            "sbin",
            "tmp",
            "usr",
        }
        assert seen["pids"] == 2 and seen["host"] == "sandbox" and not seen["trainer_folder"]  # 2: init, program
        assert seen["nnp"] and seen["seccomp"] and seen["caps"] == "0000000000000000" and seen["child"] == b"7\n"
        time.sleep(0.3)
        assert not any(b"nanorl-daemon-canary" in _cmdline(p) for p in Path("/proc").iterdir() if p.name.isdigit())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
