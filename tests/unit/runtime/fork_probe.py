"""A module the fork-server tests run as `python -m`: it reports what it is and does what argv says."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

if __name__ == "__main__":
    action = sys.argv[1]
    if action == "wait":  # until a signal; SIGTERM ends it with a line and code 7 (set before the report)
        signal.signal(signal.SIGTERM, lambda s, f: (print("got SIGTERM", flush=True), os._exit(7)))
    if action == "ignore":  # SIGTERM does nothing (as a trainer rank > 0 of `rlcore trainer serve`)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "torch": "torch" in sys.modules, "argv": sys.argv[1:],
        "cwd": os.getcwd(), "marker": os.environ.get("PROBE_MARKER"), "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
        "net": os.stat("/proc/self/ns/net").st_ino, "affinity": sorted(os.sched_getaffinity(0)), "nice": os.nice(0),
        "nofile": __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[0],
        "cmdline": open(f"/proc/{os.getpid()}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip(),
    }), flush=True)  # fmt: skip
    if action == "exit":
        sys.exit(int(sys.argv[2]))
    if action == "raise":
        raise RuntimeError("the probe failed")
    if action in ("wait", "ignore"):
        time.sleep(60)
    if action == "fd":
        os.write(int(sys.argv[2]), b"through the passed descriptor")
