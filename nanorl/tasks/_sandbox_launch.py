"""Sandbox launcher: isolate, drop privileges, filter system calls, then exec the untrusted program.

Run by `sandbox.run_python` as `python -I -S _sandbox_launch.py CONFIG_JSON` (stdlib only, never imported).

    launcher (host PID namespace, root)        enforces the wall clock, reports how the program ended
      └─ init = PID 1 of a new PID namespace   builds the minimal root, drops to the private uid, reaps
           └─ the program (python -I main.py)  when init exits the kernel kills everything left inside

As root: new mount, network, IPC, UTS and PID namespaces. The root the program sees is a fresh
read-only tmpfs holding only /usr, the /bin, /lib... links, /etc/ld.so.cache and the interpreter's
prefix (bound read-only, every site-packages/dist-packages and nanorl's own folders masked), a
private /proc, /dev with null, zero, full, random and urandom, and small writable tmpfs on /tmp and
/dev/shm; the program starts in /tmp/work. Then a private uid (host-wide unique: sandbox.py holds its
lock), no_new_privs, and a seccomp filter that refuses kernel interfaces a program has no use for.
As another user the launcher first enters new user, network, IPC, UTS and PID namespaces with its
uid mapped to itself, and init builds the same root inside them; the program keeps that uid, and its
exec (a non-zero uid) drops the capabilities the namespace gave. Where the kernel refuses
(cfg["userns"] false after a failure): a new user + network namespace if allowed, no_new_privs, the
seccomp filter and the limits, in the trainer's own files.

How the program ended travels on a pipe from init as JSON: {"status": wait status} or {"error": ...}.
The launcher writes {"status"|"error"|"timeout": ...} to cfg["status"], which the trainer reads.
"""

import ctypes
import glob
import json
import os
import resource
import signal
import struct
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP, CLONE_NEWTIME = 0x02000000, 0x00000080
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
ST_RELATIME, MNT_DETACH = 4096, 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
DEVICES = ("null", "zero", "full", "random", "urandom")

# --- seccomp: a deny list of kernel interfaces, as a classic BPF program assembled here (no compiler) ---
# Per architecture: (AUDIT_ARCH, {syscall: number}); numbers from asm/unistd_64.h and asm-generic/unistd.h.
_DENY = (
    "ptrace syslog acct mount umount2 pivot_root chroot swapon swapoff reboot sethostname setdomainname "
    "init_module delete_module finit_module quotactl kexec_load kexec_file_load add_key request_key keyctl "
    "unshare setns perf_event_open name_to_handle_at open_by_handle_at process_vm_readv process_vm_writev "
    "kcmp bpf userfaultfd io_uring_setup io_uring_enter io_uring_register open_tree move_mount fsopen fsconfig "
    "fsmount fspick pidfd_getfd mount_setattr fanotify_init lookup_dcookie vhangup iopl ioperm uselib"
).split()
_X86_64 = dict(
    zip(
        _DENY,
        [
            101,
            103,
            163,
            165,
            166,
            155,
            161,
            167,
            168,
            169,
            170,
            171,
            175,
            176,
            313,
            179,
            246,
            320,
            248,
            249,
            250,
            272,
            308,
            298,
            303,
            304,
            310,
            311,
            312,
            321,
            323,
            425,
            426,
            427,
            428,
            429,
            430,
            431,
            432,
            433,
            438,
            442,
            300,
            212,
            153,
            172,
            173,
            134,
        ],
    )
)
_AARCH64 = dict(
    zip(
        _DENY[:-3],
        [
            117,
            116,
            89,
            40,
            39,
            41,
            51,
            224,
            225,
            142,
            161,
            162,
            105,
            106,
            273,
            60,
            104,
            294,
            217,
            218,
            219,
            97,
            268,
            241,
            264,
            265,
            270,
            271,
            272,
            280,
            282,
            425,
            426,
            427,
            428,
            429,
            430,
            431,
            432,
            433,
            438,
            442,
            262,
            18,
            58,
        ],
    )
)
ARCHES = {"x86_64": (0xC000003E, _X86_64, 56), "aarch64": (0xC00000B7, _AARCH64, 220)}  # last: clone
CLONE3 = 435  # answered ENOSYS, so that libc falls back to clone(), whose flags the filter can read
NS_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWCGROUP
    | CLONE_NEWTIME
)
EPERM, ENOSYS = 1, 38
RET_KILL, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06


def seccomp_program(machine: str) -> bytes | None:
    """The filter for this machine as packed `struct sock_filter`s, or None for an architecture without a table.
    Another architecture's calls are killed; x32 calls, denied calls and clone() with namespace flags get EPERM."""
    if machine not in ARCHES:
        return None
    arch, numbers, clone = ARCHES[machine]
    ins = [(LD_W_ABS, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL), (LD_W_ABS, 0, 0, 0)]  # arch, then nr
    if machine == "x86_64":
        ins += [(JGE, 0, 1, 0x40000000), (RET, 0, 0, RET_ERRNO | EPERM)]  # the x32 ABI
    for nr in sorted(numbers.values()):
        ins += [(JEQ, 0, 1, nr), (RET, 0, 0, RET_ERRNO | EPERM)]
    ins += [(JEQ, 0, 1, CLONE3), (RET, 0, 0, RET_ERRNO | ENOSYS)]
    ins += [(JEQ, 0, 3, clone), (LD_W_ABS, 0, 0, 16), (JSET, 0, 1, NS_FLAGS), (RET, 0, 0, RET_ERRNO | EPERM)]
    ins += [(RET, 0, 0, RET_ALLOW)]
    return b"".join(struct.pack("HBBI", *i) for i in ins)


def lock_down(libc) -> None:
    """no_new_privs (no setuid binary can give privileges back), then the seccomp filter where one exists."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    program = seccomp_program(os.uname().machine)
    if program is None:
        return

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // 8, program)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# --- the minimal root ---


def _check(ret: int, what: str) -> None:
    if ret != 0:
        raise OSError(ctypes.get_errno(), f"{what} failed")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _kept_flags(path: str) -> int:
    """The flags of the mount holding `path` that a remount must repeat (in a user namespace they are locked)."""
    f = os.statvfs(path).f_flag
    return (f & (MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)) | (MS_RELATIME if f & ST_RELATIME else 0)


def _bind_ro(libc, source: str, target: str, extra: int = MS_NODEV) -> None:
    _mount(libc, source, target, None, MS_BIND)
    _mount(libc, None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | extra | _kept_flags(source))


def _mountpoint(path: str, like: str) -> None:
    """An empty directory or file at `path` (in the root being built) to mount `like` onto."""
    if os.path.isdir(like):
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def visible_trees(prefix: str) -> list[str]:
    """Host folders the program sees, read-only: /usr and the interpreter's prefix where that lies elsewhere."""
    return ["/usr"] + ([prefix] if not _inside(prefix, "/usr") else [])


def masked(trees: list[str], hide: list[str]) -> list[str]:
    """Folders inside the visible trees to cover with an empty tmpfs: every site-packages and dist-packages
    (installed packages, nanorl itself among them) and the folders named in `hide` (nanorl, the checkout)."""
    found = set()
    for tree in trees:
        for pattern in (
            "lib*/python3*/site-packages",
            "lib*/python3*/dist-packages",
            "local/lib*/python3*/site-packages",
            "local/lib*/python3*/dist-packages",
        ):
            found.update(glob.glob(os.path.join(tree, pattern)))
    found.update(h for h in hide if os.path.isdir(h))
    found = {os.path.realpath(p) for p in found}
    found = {p for p in found if any(_inside(p, t) and p != t for t in trees)}
    return sorted(p for p in found if not any(q != p and _inside(p, q) for q in found))  # outermost only


def build_root(libc, cfg: dict, prefix: str) -> None:
    """Mount the minimal root on cfg["root"] and pivot into it (we are in new mount and PID namespaces)."""
    new = cfg["root"]
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    _mount(libc, "tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    trees = visible_trees(prefix)
    for tree in trees:
        _mountpoint(new + tree, tree)
        _bind_ro(libc, tree, new + tree)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged-/usr links, or the folders
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(new, name))
        elif os.path.isdir(host):
            _mountpoint(new + host, host)
            _bind_ro(libc, host, new + host)
    if os.path.isfile("/etc/ld.so.cache"):
        _mountpoint(new + "/etc/ld.so.cache", "/etc/ld.so.cache")
        _bind_ro(libc, "/etc/ld.so.cache", new + "/etc/ld.so.cache")
    for path in masked(trees, cfg["hide"]):
        _mount(libc, "tmpfs", new + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")
    for dev in DEVICES:
        if os.path.exists("/dev/" + dev):
            _mountpoint(f"{new}/dev/{dev}", "/dev/" + dev)
            _bind_ro(libc, "/dev/" + dev, f"{new}/dev/{dev}", extra=0)
    for link, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{new}/dev/{link}")
    size = f"size={cfg['tmp_mb']}m,nr_inodes=4096,mode=1777"
    for place in ("/tmp", "/dev/shm"):
        os.makedirs(new + place)
        _mount(libc, "tmpfs", new + place, "tmpfs", MS_NOSUID | MS_NODEV, size)
    os.makedirs(new + "/proc")
    _mount(libc, "proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's
    os.makedirs(new + "/tmp/work", 0o700)
    if os.geteuid() == 0:  # in a user namespace we are the program's uid already
        os.chown(new + "/tmp/work", cfg["uid"], cfg["uid"])
    os.chdir(new)
    _check(libc.syscall(155 if os.uname().machine == "x86_64" else 41, b".", b"."), "pivot_root")  # SYS_pivot_root
    _check(libc.umount2(b".", MNT_DETACH), "detaching the old root")  # the host's tree, gone from view
    os.chdir("/")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


# --- the three processes ---


def interpreter() -> str:
    """The real interpreter behind sys.executable (a venv's link), or the prefix's own where the venv holds a copy."""
    real, prefix = os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
    if any(_inside(real, t) for t in visible_trees(prefix)):
        return real
    return os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")


def set_limits(cfg: dict) -> None:
    limits = [
        (resource.RLIMIT_CPU, cfg["cpu_s"]),
        (resource.RLIMIT_AS, cfg["memory_mb"] << 20),
        (resource.RLIMIT_NPROC, cfg["procs"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ]
    for kind, value in limits:
        resource.setrlimit(kind, (value, value))


def init(cfg: dict, program: str, report_fd: int, data_fd: int, isolated: bool) -> None:
    """PID 1 of the sandbox: set up, drop privileges, run the program, reap, report its wait status."""
    libc = ctypes.CDLL(None, use_errno=True)
    python = interpreter()
    low, high = sorted((report_fd, data_fd))  # the uid lock and all else the launcher holds: not ours to keep
    for start, stop in ((3, low), (low + 1, high), (high + 1, 1 << 20)):
        os.closerange(start, stop)
    try:
        if isolated:
            _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")  # ours alone: the launcher keeps the host's
            build_root(libc, cfg, os.path.realpath(sys.base_prefix))
            libc.sethostname(b"sandbox", 7)
            work = "/tmp/work"
        if isolated and os.geteuid() == 0:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])  # from here on: no privileges, a uid no other process on the host uses
        if not isolated:
            work = cfg["workdir"]
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher gone (killed): so are we
        lock_down(libc)
        set_limits(cfg)
        os.chdir(work)
        with open("main.py", "w") as f:
            f.write(program)
    except OSError as e:
        os.write(report_fd, json.dumps({"error": f"sandbox set-up: {e}"}).encode())
        os._exit(1)
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    pid = os.fork()
    if pid == 0:
        os.dup2(data_fd, 3)
        os.set_inheritable(3, True)
        os.closerange(4, 1 << 10)
        if not isolated:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # no PID namespace to take it down with init
        os.execve(python, [python, "-I", "main.py"], env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the program may signal PID 1: only handled signals arrive
    while True:  # reap orphans until the program itself ends
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            break
    os.write(report_fd, json.dumps({"status": status}).encode())
    os._exit(0)


def enter_user_namespace(libc) -> bool:
    """As another user: new user, network, IPC, UTS and PID namespaces, our uid and gid mapped to themselves.
    We hold every capability inside them (enough to build the root); the program's exec as a non-zero uid
    drops them all. False where the kernel refuses unprivileged user namespaces."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID) != 0:
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return True


def main() -> None:
    cfg = json.loads(sys.argv[1])
    with open(cfg["program"]) as f:
        program = f.read()
    data_fd = os.open(cfg["data"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    if root:
        isolated = libc.unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID) == 0
    else:
        isolated = cfg["userns"] and enter_user_namespace(libc)
        if not isolated:
            libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)  # best effort: no network where the kernel allows it
    if root and not isolated:
        report = {"error": f"sandbox: unshare failed (errno {ctypes.get_errno()})"}
    else:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            init(cfg, program, write_fd, data_fd, isolated)
        os.close(write_fd)
        timed_out = []

        def on_alarm(*_):
            timed_out.append(True)
            os.kill(pid, signal.SIGKILL)  # PID 1 of the namespace: every process inside goes with it

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, cfg["wall_s"])
        _, status = os.waitpid(pid, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        with os.fdopen(read_fd, "rb") as f:
            said = f.read(4096)
        report = {"timeout": True} if timed_out else json.loads(said) if said else {"status": status or 0x7F00}
    with open(cfg["status"], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
