"""host:port strings: checking them, and the host other processes reach a server at. No grpc
import here: config validation uses it without loading the RPC stack."""

from __future__ import annotations

import socket

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
"""Hosts only this machine reaches."""


def is_host_port(address: str) -> bool:
    """host:port with a non-empty host (IPv6 in brackets) and a port in 1..65535."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    if ":" in host:  # IPv6 must be bracketed, or the port is ambiguous
        return host.startswith("[") and host.endswith("]") and len(host) > 2
    return True


def bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def reachable_host(bind_host: str) -> str:
    """The host other processes dial for a server bound to `bind_host` (the machine's name when it
    is bound to every interface)."""
    return socket.gethostname() if bind_host in WILDCARD_HOSTS else bind_host
