"""Who asks: every key `rlcore tinker serve` accepts (its --api-key-env variable holds one, or several
separated by commas) is a tenant, and what a tenant creates (sessions, training models, samplers,
and the checkpoints of its models) only its own key reaches: another key is answered as if it did
not exist (404), and listings show a key its own. A tenant is named by a hash of its key, which is
what the server's records keep (never the key)."""

from __future__ import annotations

import hashlib
import hmac
from contextvars import ContextVar

CALLER: ContextVar[str] = ContextVar("rlcore_tinker_caller", default="")
"""The tenant of the request being served (app.py's middleware sets it); "" inside the server's
own threads, which act for whoever queued the work."""


def keys_of(value: str) -> list[str]:
    """The keys a server accepts, from its key variable's value."""
    return [k.strip() for k in value.split(",") if k.strip()]


def tenant_of(given: str, keys: list[str]) -> str | None:
    """The tenant of key `given`, or None when it is none of `keys` (compared in constant time)."""
    matched = [hmac.compare_digest(given.encode(), k.encode()) for k in keys]
    return hashlib.sha256(given.encode()).hexdigest()[:16] if any(matched) else None


def sees(owner: str, caller: str | None = None) -> bool:
    """Whether the caller (CALLER unless given) reaches what `owner` created: its own, what nobody
    owns (records of a server that kept no owners), and everything from the server's own threads."""
    who = CALLER.get() if caller is None else caller
    return not who or not owner or owner == who
