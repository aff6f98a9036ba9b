"""The sandbox launcher's pure parts, on any machine: the seccomp program (run through a small classic-BPF
interpreter, for every architecture it has a table for) and the folders masked in the minimal root."""

import importlib.util
import struct
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("launch", Path(__file__).parents[1] / "nanorl/tasks/_sandbox_launch.py")
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)
ALLOW, KILL = launch.RET_ALLOW, launch.RET_KILL
EPERM, ENOSYS = launch.RET_ERRNO | launch.EPERM, launch.RET_ERRNO | launch.ENOSYS


def run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the kernel would answer: a slow reference interpreter for the few classic-BPF instructions used."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)  # struct seccomp_data
    ins = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == launch.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == launch.RET:
            return k
        else:
            taken = {launch.JEQ: acc == k, launch.JGE: acc >= k, launch.JSET: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("machine", sorted(launch.ARCHES))
def test_seccomp_denies_the_listed_calls_and_allows_the_rest(machine):
    program = launch.seccomp_program(machine)
    arch, numbers, clone = launch.ARCHES[machine]
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # BPF_MAXINSNS
    for name, nr in numbers.items():
        assert run_bpf(program, nr, arch) == EPERM, name
    denied = set(numbers.values()) | {clone, launch.CLONE3}
    for nr in set(range(460)) - denied:  # read, write, openat, mmap, futex, ...: untouched
        assert run_bpf(program, nr, arch) == ALLOW, nr
    assert run_bpf(program, launch.CLONE3, arch) == ENOSYS  # libc falls back to clone
    assert run_bpf(program, clone, arch, arg0=0x01200011) == ALLOW  # fork()'s flags
    assert run_bpf(program, clone, arch, arg0=0x003D0F00) == ALLOW  # a thread's flags
    for flag in (launch.CLONE_NEWUSER, launch.CLONE_NEWNS, launch.CLONE_NEWPID, launch.CLONE_NEWNET):
        assert run_bpf(program, clone, arch, arg0=0x01200011 | flag) == EPERM
    assert run_bpf(program, 0, 0x40000003) == KILL  # another architecture (i386) altogether
    if machine == "x86_64":
        assert run_bpf(program, 0x40000000 + 1, arch) == EPERM  # the x32 ABI
    assert launch.seccomp_program("riscv64") is None  # no table: no_new_privs only


def test_masked_folders_are_the_outermost_inside_the_visible_trees(tmp_path):
    prefix = tmp_path / "py"
    for d in ("lib/python3.11/site-packages/pkg", "lib/python3.11/lib-dynload", "src/checkout/nanorl"):
        (prefix / d).mkdir(parents=True)
    hide = [str(prefix / "src/checkout/nanorl"), str(prefix / "src/checkout"), "/nowhere", str(prefix)]
    assert launch.masked([str(prefix)], hide) == [
        str(prefix / "lib/python3.11/site-packages"),
        str(prefix / "src/checkout"),
    ]
    assert launch.visible_trees("/usr") == ["/usr"] and launch.visible_trees(str(prefix)) == ["/usr", str(prefix)]
