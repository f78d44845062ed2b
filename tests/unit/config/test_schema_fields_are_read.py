"""Every config field is read somewhere outside the config package: a field nothing reads lets a user
set a value that silently does nothing."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from rlcore.core.config import schema

ROOT = Path(__file__).resolve().parents[3]


def schema_fields() -> list[str]:
    classes = [c for c in vars(schema).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    return sorted({f"{c.__name__}.{f.name}" for c in classes for f in dataclasses.fields(c)})


def test_every_schema_field_has_a_reader() -> None:
    # A textual check for `.field_name` anywhere in the sources: an unrelated attribute of the same
    # name hides a dead field, and a field read only through getattr with a string is reported.
    # The run plan (core/config/plan.py) reads the fields that shape a run for everything else.
    sources = [
        path.read_text()
        for path in ROOT.rglob("*.py")
        if not path.relative_to(ROOT).as_posix().startswith(("tests/", ".", "core/config/"))
        or path.relative_to(ROOT).as_posix() == "core/config/plan.py"
    ]
    text = "\n".join(sources)
    assert len(sources) > 20, f"found only {len(sources)} source files under {ROOT}"
    unread = [name for name in schema_fields() if not re.search(rf"\.{name.split('.')[1]}\b", text)]
    assert not unread, f"schema fields no code reads (remove them or read them): {', '.join(unread)}"
