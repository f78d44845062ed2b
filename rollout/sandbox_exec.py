"""The child side of rollout/sandbox.py: confine this process, then exec the untrusted program.

    python -I sandbox_exec.py POLICY_JSON -- PROGRAM [ARGS...]

Run as a script (it imports nothing of rlcore, and nothing but the standard library), in the folder
the program may write to, with the environment it may see. The parent probes the machine once with
`--probe` and says what it could not have. Two stages:

outer (always):
1. resource limits: address space, CPU seconds, size of any file written (stdout and stderr are
   files too, so this caps the output), open files, no core dumps, processes (RLIMIT_NPROC, which
   the kernel does not apply to root: there a pids cgroup of its own takes its place);
2. with the bubblewrap backend, exec `bwrap` (its arguments come in the policy: a fresh root
   holding only the allowed folders, its own user, pid, ipc, uts, cgroup and network namespaces,
   no capabilities), which runs this script again as the inner stage.

inner (in bwrap, or straight after the outer stage with rlcore's own backend):
3. no network: namespaces of its own with nothing in them (a network namespace as root; a user and
   a network namespace otherwise) — even 127.0.0.1 is unreachable;
4. no capabilities: the bounding, ambient, effective, permitted and inheritable sets emptied (a
   root without capabilities cannot make device nodes, read what the file modes refuse root, ...);
5. Landlock on the file system: read and execute beneath the interpreter's own folders, the
   system's (/usr, /lib, ...) and a few files of /etc (not /etc/shadow), everything beneath the
   working folder but device nodes, nothing elsewhere (not /proc of other processes); no signals
   or ptrace to processes outside, no abstract unix sockets made outside (ABI 6);
6. seccomp: without network, no socket() at all (TCP, UDP, unix sockets by path or abstract, raw,
   netlink; socketpair() still works), and never io_uring (it opens sockets past socket());
   system calls of another architecture (x32, i386) kill the process;
7. exec. Anything that should have applied and did not ends the launcher (exit 126, the reason on
   stderr): the program never runs less confined than the probe promised.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import struct
import sys

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 38, 23, 24, 47
PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
SYS_LANDLOCK = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}
"""Syscall numbers, the same on x86-64 and arm64 (the generic table)."""
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_MAKE_CHAR, FS_MAKE_BLOCK, FS_TRUNCATE = 1 << 6, 1 << 11, 1 << 14
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
    "/opt",
    "/proc/self",
    "/sys/devices/system/cpu",
)
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group",
    "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf", "/etc/resolv.conf", "/etc/gai.conf", "/etc/ssl",
    "/etc/ca-certificates", "/etc/mime.types", "/etc/os-release", "/etc/alternatives",
)  # fmt: skip
"""What of /etc a program may read: the loader's cache, time zone, names and certificates (for a tool
allowed the network); not the rest (/etc/shadow, keys, the machine's configuration)."""
DEVICES_RW = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random")
PIDS_CGROUPS = {"/sys/fs/cgroup/pids": None, "/sys/fs/cgroup": "cgroup.subtree_control"}
"""Where a pids controller may be: cgroup v1's own hierarchy, or the cgroup v2 root when it hands the
controller to its children (the file that says so)."""
SECCOMP = {  # audit arch, socket, io_uring_setup, io_uring_enter, io_uring_register
    "x86_64": (0xC000003E, 41, 425, 426, 427),
    "aarch64": (0xC00000B7, 198, 425, 426, 427),
}
"""The system calls the filter names, per architecture (x86-64's table; arm64 uses the generic one)."""


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


LIBC = ctypes.CDLL(None, use_errno=True)


class Refused(RuntimeError):
    """A protection the policy asks for could not be applied: the program must not run."""


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none, or disabled)."""
    version = LIBC.syscall(SYS_LANDLOCK["create_ruleset"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, version)


def can_unshare_network() -> bool:
    """Whether this process may make a network namespace, with a user namespace of its own where it is
    not root (probed in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if LIBC.unshare(CLONE_NEWNET | (0 if os.geteuid() == 0 else CLONE_NEWUSER)) == 0 else 1)
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
        "seccomp": platform.machine() in SECCOMP,
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


def isolate(network: bool) -> bool:
    """Namespaces of its own: a network namespace with nothing in it unless the policy allows the
    network, and where it is not root a user namespace (in which it keeps its uid and gid, mapped to
    themselves), which is also what lets it drop its bounding set. True where it made one."""
    uid, gid = os.getuid(), os.getgid()
    flags = (0 if network else CLONE_NEWNET) | (0 if uid == 0 else CLONE_NEWUSER)
    if not flags:
        return False
    if LIBC.unshare(flags) != 0:
        raise Refused(f"unshare (namespaces): {os.strerror(ctypes.get_errno())}")
    if uid != 0:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return True


def drop_capabilities(bounding: bool) -> None:
    """Empty every capability set, and with `bounding` (root, or a user namespace of its own) the
    bounding set too, so that exec cannot give a root program its capabilities back (elsewhere
    no_new_privs keeps set-user-id and file capabilities from giving any)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1) if bounding else ():
        if LIBC.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 and LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise Refused(f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = CapHeader(0x20080522, 0), (ctypes.c_uint32 * 6)()  # version 3: two sets of three
    if LIBC.capset(ctypes.byref(header), data) != 0:
        raise Refused(f"capset: {os.strerror(ctypes.get_errno())}")
    with open("/proc/self/status") as f:
        held = {k: v.strip() for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}
    if not bounding:
        held.pop("CapBnd")
    if any(int(value, 16) for value in held.values()):
        raise Refused(f"capabilities left after dropping them: {held}")


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
        raise Refused(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    rules = [(path, READ_ONLY) for path in (*policy["read_dirs"], *ETC_FILES)]
    rules += [(path, READ_ONLY | FS_WRITE_FILE) for path in DEVICES_RW]
    rules.append((os.getcwd(), fs_all & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK)))
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a folder this machine does not have
        if not os.path.isdir(path):
            access &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (fs_all & FS_TRUNCATE)  # file rights only
        rule = PathBeneathAttr(access & fs_all, fd)
        if LIBC.syscall(SYS_LANDLOCK["add_rule"], ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) < 0:
            raise Refused(f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    if LIBC.syscall(SYS_LANDLOCK["restrict_self"], ruleset, 0) < 0:
        raise Refused(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    os.close(ruleset)


def seccomp_filter(allow_sockets: bool) -> bytes:
    """A classic BPF program over `struct seccomp_data` (nr at offset 0, arch at 4, args from 16)."""
    arch, socket_nr, *io_uring = SECCOMP[platform.machine()]
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, RET|K
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, eacces = 0x00050000 | 1, 0x00050000 | 13
    denied = [(nr, eperm) for nr in io_uring] + ([] if allow_sockets else [(socket_nr, eacces)])
    program = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    program += [(jset, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # x32's numbers carry this bit
    for nr, action in denied:
        program += [(jeq, 0, 1, nr), (ret, 0, 0, action)]
    program.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def install_seccomp(allow_sockets: bool) -> None:
    code = seccomp_filter(allow_sockets)
    prog = SockFprog(len(code) // 8, code)
    if LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise Refused(f"seccomp: {os.strerror(ctypes.get_errno())}")


def confine(policy: dict) -> None:
    """Steps 3-6 of the docstring, in the order the kernel needs (namespaces need the capabilities
    that step 4 drops; Landlock and seccomp need no_new_privs)."""
    network, wrapped = policy["network"], policy.get("wrapped", False)
    own = not wrapped and policy["netns"] and isolate(network)
    drop_capabilities(bounding=own or os.geteuid() == 0)
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise Refused(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    restrict_files(policy, block_tcp=not network)
    if policy["seccomp"]:
        install_seccomp(allow_sockets=network)


def main(argv: list[str]) -> None:
    if argv[1:] == ["--probe"]:
        print(json.dumps(probe()))
        return
    policy, program = json.loads(argv[1]), argv[3:]
    assert argv[2] == "--" and program, "usage: sandbox_exec.py POLICY_JSON -- PROGRAM [ARGS...]"
    if not policy.get("wrapped"):
        limit_resources(policy)
    if policy.get("wrapper"):  # bubblewrap runs this script again, inside, as the inner stage
        inner = {**policy, "wrapper": None, "wrapped": True}
        os.execv(policy["wrapper"][0], [*policy["wrapper"], sys.executable, "-I", os.path.abspath(argv[0]),
                                        json.dumps(inner), "--", *program])  # fmt: skip
    try:
        confine(policy)
    except (Refused, OSError) as e:
        print(f"sandbox: refused to run the program: {e}", file=sys.stderr)
        os._exit(126)
    os.execve(program[0], program, os.environ.copy())


if __name__ == "__main__":
    main(sys.argv)
