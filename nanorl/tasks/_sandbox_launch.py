"""Sandbox launcher: set up isolation, drop privileges, then exec the untrusted program.

Run by `sandbox.run_python` as `python -I _sandbox_launch.py CONFIG_JSON` (stdlib only, never imported).
As root: new network and mount namespaces, fresh tmpfs over /tmp, /var/tmp, /dev/shm and
/run/lock (so nothing the program writes there reaches the host), the interpreter bound read-only,
the program copied into /tmp/work, then setgid/setuid to
an unprivileged uid of its own. As another user: a new user + network namespace where the kernel
allows it, else no network isolation. Then resource limits, and exec.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x40000000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18


def main() -> None:
    cfg = json.loads(sys.argv[1])
    with open(cfg["program"]) as f:
        program = f.read()
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0:
        # resolve the interpreter now: a venv under /tmp disappears once /tmp is a fresh tmpfs
        real = os.path.realpath(sys.executable)
        python = os.path.join("/tmp/.python", os.path.relpath(real, sys.base_prefix))
        if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
            sys.exit(f"sandbox: unshare failed (errno {ctypes.get_errno()})")
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        prefix_fd = os.open(sys.base_prefix, os.O_RDONLY | os.O_DIRECTORY)  # in the new namespace
        for target in (b"/tmp", b"/var/tmp", b"/dev/shm", b"/run/lock"):  # the world-writable places
            if os.path.isdir(target):
                if libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=1777") != 0:
                    sys.exit(f"sandbox: tmpfs on {target!r} failed (errno {ctypes.get_errno()})")
        # the interpreter may live where the sandbox uid cannot reach (e.g. under /root): bind it, read-only
        base = "/tmp/.python"
        os.mkdir(base, 0o755)
        source = f"/proc/self/fd/{prefix_fd}".encode()  # the prefix, even if now hidden under a tmpfs
        if libc.mount(source, base.encode(), None, MS_BIND | MS_REC, None) != 0 or \
                libc.mount(None, base.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
            sys.exit(f"sandbox: binding the interpreter failed (errno {ctypes.get_errno()})")
        os.close(prefix_fd)
        work = "/tmp/work"
        os.mkdir(work, 0o700)
        os.chown(work, cfg["uid"], cfg["uid"])
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])  # from here on: no privileges, a uid no other process uses
    else:
        work, python = cfg["workdir"], sys.executable
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)  # best effort: no network where the kernel allows it
    os.chdir(work)
    with open("main.py", "w") as f:
        f.write(program)
    limits = [(resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS, cfg["memory_mb"] << 20),
              (resource.RLIMIT_NPROC, cfg["procs"]), (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
              (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)]
    for kind, value in limits:
        resource.setrlimit(kind, (value, value))
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "NANORL_NONCE": cfg["nonce"]}
    os.execve(python, [python, "-I", "main.py"], env)


if __name__ == "__main__":
    main()
