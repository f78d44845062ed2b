"""In-process engines across stages (rollout/engines/in_process.py): a process-wide engine is built
once and handed to every later stage with the same settings; other engines are built per stage.

vLLM is the process-wide type in production; these tests mark the HF engine process-wide instead, so
the keeping logic runs on a real engine without vLLM (the vLLM path runs in test_vllm_loop.py)."""

from __future__ import annotations

import pytest

from rlcore.core.config.schema import ScratchModelConfig
from rlcore.core.scratch_model import build_scratch_model
from rlcore.rollout.engines import in_process
from rlcore.rollout.engines.spec import EngineSpec

SETTINGS = {"device": "cpu", "dtype": "float32", "max_model_len": 256, "max_batch_size": 8}


def hf(model_path: str, **changes: int) -> EngineSpec:
    return EngineSpec(engine_type="hf", model_path=model_path, **{**SETTINGS, **changes})


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(in_process, "_kept", None)


def test_a_process_wide_engine_serves_the_next_stage_and_is_not_closed(
    fresh, tiny_model_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(in_process, "PROCESS_WIDE", frozenset({"hf"}))
    engine, reused = in_process.acquire(hf(tiny_model_path))
    assert not reused
    closed: list[bool] = []
    monkeypatch.setattr(engine, "close", lambda: closed.append(True))
    in_process.release(engine)
    assert not closed  # kept open for the next stage
    again, reused = in_process.acquire(hf(tiny_model_path))
    assert again is engine and reused


def test_other_engines_are_built_per_stage_and_closed(
    fresh, tiny_model_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, reused = in_process.acquire(hf(tiny_model_path))
    closed: list[bool] = []
    monkeypatch.setattr(first, "close", lambda: closed.append(True))
    in_process.release(first)
    assert closed
    second, reused_second = in_process.acquire(hf(tiny_model_path))
    assert second is not first and not reused and not reused_second


def test_a_stage_asking_for_other_settings_or_another_architecture_is_refused(
    fresh, tiny_model_path: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(in_process, "PROCESS_WIDE", frozenset({"hf"}))
    in_process.acquire(hf(tiny_model_path))
    with pytest.raises(ValueError, match=r"asks for other settings \(max_batch_size: 8 -> 16\): give every"):
        in_process.acquire(hf(tiny_model_path, max_batch_size=16))

    same_arch, wider = str(tmp_path / "seed1"), str(tmp_path / "wider")
    build_scratch_model(same_arch, ScratchModelConfig(enabled=True), max_model_len=256, seed=1)
    build_scratch_model(wider, ScratchModelConfig(enabled=True, hidden_size=256), max_model_len=256, seed=0)
    _, reused = in_process.acquire(hf(same_arch))  # other weights, same shapes: pushed later
    assert reused
    with pytest.raises(ValueError, match=r"is not the architecture .* hidden_size: 128 -> 256"):
        in_process.acquire(hf(wider))
