"""What the `rlcore ... serve` commands share: one-line usage errors, TLS from flags, port files."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from .security import TLSFiles

EXIT_USAGE = 2


def usage_error(message: str) -> int:
    """Print `rlcore: error: <message>` and return the usage exit code."""
    print(f"rlcore: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def tls_from_args(args: argparse.Namespace) -> TLSFiles | None:
    """TLS files from the --tls-* flags (None: plaintext); ValueError on an incomplete set."""
    if not (args.tls_cert or args.tls_key or args.tls_ca or args.tls_require_client_cert):
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if args.tls_require_client_cert and not args.tls_ca:
        raise ValueError("--tls-require-client-cert needs --tls-ca (the CA client certificates chain to)")
    return TLSFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_require_client_cert)


def write_atomic(path: str, text: str) -> None:
    """Write through a temporary file and a rename: readers never see a half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def await_port_file(port_file: str, proc: subprocess.Popen, timeout_s: float, what: str) -> str:
    """The host:port a server started as `proc` writes to its port file (atomically) once it serves;
    RuntimeError("<what> did not start ...") when it exits first or takes longer than `timeout_s`
    (it is killed then)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start (exit code {proc.wait()})")
        time.sleep(0.1)
    with open(port_file) as f:
        return f.read().strip()
