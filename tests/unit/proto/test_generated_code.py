"""The committed generated code must be what grpcio-tools makes from the .proto files today."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_generated_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "proto", "generate.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout


def test_every_field_and_service_of_the_schema_is_documented() -> None:
    """Each message field, enum value and rpc in proto/rlcore/v1 has a comment just above it."""
    folder = os.path.join(ROOT, "proto", "rlcore", "v1")
    undocumented = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".proto"):
            continue
        with open(os.path.join(folder, name)) as f:
            lines = [line.strip() for line in f]
        for i, line in enumerate(lines):
            is_field = line.endswith(";") and "=" in line and not line.startswith(("syntax", "option"))
            if (is_field or line.startswith("rpc ")) and not lines[i - 1].startswith("//"):
                undocumented.append(f"{name}:{i + 1}: {line}")
    assert not undocumented, "\n".join(undocumented)


def test_generated_modules_import_inside_the_package() -> None:
    from rlcore.proto.v1 import rollout_pb2, rollout_pb2_grpc, run_pb2, trainer_pb2  # noqa: F401

    services = {
        s.full_name
        for m in (rollout_pb2, run_pb2, trainer_pb2)
        for s in m.DESCRIPTOR.services_by_name.values()
    }
    assert services == {"rlcore.v1.RolloutService", "rlcore.v1.RunService", "rlcore.v1.TrainerService"}
