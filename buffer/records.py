"""How an experience is stored (file and sql backends): a JSON object with every Experience field
and the schema version `v` (bytes fields as base64 text). A reader refuses a version it does not know
instead of misreading it."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from ..core.types import Experience
from .base import BufferError, Group

SCHEMA_VERSION = 1
_FIELDS = {f.name for f in dataclasses.fields(Experience)}


def to_record(e: Experience) -> dict[str, Any]:
    record = {"v": SCHEMA_VERSION, **dataclasses.asdict(e)}
    record["routed_experts"] = base64.b64encode(e.routed_experts).decode("ascii")
    return record


def from_record(record: dict[str, Any], where: str) -> Experience:
    version = record.get("v")
    if version != SCHEMA_VERSION:
        raise BufferError(
            f"{where}: an experience stored with schema version {version}; this rlcore reads version "
            f"{SCHEMA_VERSION}: read it with the rlcore that wrote it, or start a new buffer"
        )
    fields = {k: v for k, v in record.items() if k in _FIELDS}
    if "routed_experts" in fields:
        fields["routed_experts"] = base64.b64decode(fields["routed_experts"])
    missing = _FIELDS - fields.keys() - {f.name for f in dataclasses.fields(Experience) if _has_default(f)}
    if missing:
        raise BufferError(f"{where}: a stored experience lacks {', '.join(sorted(missing))}")
    return Experience(**fields)


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def group_to_json(group: Group) -> str:
    return json.dumps([to_record(e) for e in group], separators=(",", ":"))
