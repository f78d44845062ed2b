"""The child side of rollout/sandbox.py: confine this process, then exec the untrusted program.

    python -I sandbox_exec.py POLICY_JSON -- PROGRAM [ARGS...]

Run as a script (it imports nothing of rlcore, and nothing but the standard library), in the folder
the program may write to, with the environment it may see. In order, each step where the machine
allows it (what was applied goes to stderr's first line only on failure; the parent probes the
machine once with `--probe` and says what it could not have):

1. resource limits: address space, CPU seconds, size of any file written (stdout and stderr are
   files too, so this caps the output), open files, no core dumps, processes (RLIMIT_NPROC, which
   the kernel does not apply to root: there a pids cgroup of its own takes its place);
2. no network: a network namespace of its own with nothing in it (needs CAP_SYS_ADMIN; the
   loopback of the namespace is down, so even 127.0.0.1 is unreachable); without it, Landlock
   refuses every TCP bind and connect (Linux >= 6.7);
3. Landlock on the file system: read and execute beneath the interpreter's own folders and the
   system's (/usr, /lib, /etc, ...), everything beneath the working folder, nothing elsewhere;
4. exec.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}
"""Syscall numbers, the same on x86-64 and arm64 (the generic table)."""
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
"""Every file-system right Landlock knows at each ABI version (ABI 4 and 6+ add none)."""
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
"""ABI 6: no signals to processes outside the sandbox (the worker that started it), no connecting to
abstract unix sockets made outside it."""
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
SYSTEM_DIRS = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc",
    "/opt",
    "/proc/self",
    "/sys/devices/system/cpu",
)
DEVICES_RW = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random")
PIDS_CGROUPS = {"/sys/fs/cgroup/pids": None, "/sys/fs/cgroup": "cgroup.subtree_control"}
"""Where a pids controller may be: cgroup v1's own hierarchy, or the cgroup v2 root when it hands the
controller to its children (the file that says so)."""


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


LIBC = ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none, or disabled)."""
    version = LIBC.syscall(SYS_LANDLOCK["create_ruleset"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, version)


def can_unshare_network() -> bool:
    """Whether this process may make a network namespace (probed in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if LIBC.unshare(CLONE_NEWNET) == 0 else 1)
    return os.waitpid(pid, 0)[1] == 0


def pids_cgroup_root() -> str | None:
    """A writable cgroup folder whose children have `pids.max` (None: none here)."""
    for root, controllers in PIDS_CGROUPS.items():
        if not (os.path.isfile(os.path.join(root, "cgroup.procs")) and os.access(root, os.W_OK)):
            continue
        if controllers is None:
            return root
        with open(os.path.join(root, controllers)) as f:
            if "pids" in f.read().split():
                return root
    return None


def probe() -> dict[str, object]:
    """What this machine lets the sandbox enforce."""
    return {
        "landlock_abi": landlock_abi(),
        "netns": can_unshare_network(),
        "root": os.geteuid() == 0,
        "pids_cgroup": pids_cgroup_root(),
    }


def limit_resources(policy: dict) -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (policy["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (policy["cpu_s"], policy["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (policy["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    if os.geteuid() != 0:
        # counts every process of this user, so the headroom is on top of what it runs already
        resource.setrlimit(resource.RLIMIT_NPROC, (running_processes() + policy["max_processes"],) * 2)
    elif policy.get("pids_cgroup"):
        group = os.path.join(policy["pids_cgroup"], f"rlcore-sandbox-{os.getpid()}")
        os.mkdir(group)
        with open(os.path.join(group, "pids.max"), "w") as f:
            f.write(str(policy["max_processes"]))
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def running_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                continue
    return count


def isolate_network(policy: dict) -> bool:
    """A network namespace of its own; False where that is not allowed (Landlock's TCP rules then)."""
    return policy["netns"] and LIBC.unshare(CLONE_NEWNET) == 0


def restrict_files(policy: dict, block_tcp: bool) -> None:
    abi = policy["landlock_abi"]
    if abi < 1:
        return
    fs_all = FS_ALL_BY_ABI[max(k for k in FS_ALL_BY_ABI if k <= abi)]
    net = NET_BIND_TCP | NET_CONNECT_TCP if block_tcp and abi >= 4 else 0
    attr = RulesetAttr(fs_all, net, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 * (3 if abi >= 6 else 2 if abi >= 4 else 1)  # the struct as this ABI knows it
    ruleset = LIBC.syscall(SYS_LANDLOCK["create_ruleset"], ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    rules = [(path, READ_ONLY) for path in policy["read_dirs"]] + [
        (path, READ_ONLY | FS_WRITE_FILE) for path in DEVICES_RW
    ]
    rules.append((os.getcwd(), fs_all))
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a folder this machine does not have
        if not os.path.isdir(path):
            access &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (fs_all & (1 << 14))  # file rights only
        rule = PathBeneathAttr(access & fs_all, fd)
        if LIBC.syscall(SYS_LANDLOCK["add_rule"], ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        os.close(fd)
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if LIBC.syscall(SYS_LANDLOCK["restrict_self"], ruleset, 0) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def main(argv: list[str]) -> None:
    if argv[1:] == ["--probe"]:
        print(json.dumps(probe()))
        return
    policy, program = json.loads(argv[1]), argv[3:]
    assert argv[2] == "--" and program, "usage: sandbox_exec.py POLICY_JSON -- PROGRAM [ARGS...]"
    limit_resources(policy)
    isolated = policy["network"] or isolate_network(policy)
    restrict_files(policy, block_tcp=not isolated)
    os.execve(program[0], program, os.environ.copy())


if __name__ == "__main__":
    main(sys.argv)
