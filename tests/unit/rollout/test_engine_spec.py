"""An engine's settings (rollout/engines/spec.py, build_engine): each engine takes the options its
constructor declares; a setting it would ignore is refused in one line naming the key."""

from __future__ import annotations

import pytest

from rlcore.rollout.engines import build_engine, engine_class, engine_options
from rlcore.rollout.engines.base import RolloutEngine
from rlcore.rollout.engines.spec import EngineSpec, engine_spec


class Recording(RolloutEngine):
    """Records what it was built with; generates nothing."""

    def __init__(self, model_path, *, device, dtype, max_model_len, max_batch_size, seed=0, width=1):
        self.built = dict(model_path=model_path, device=device, dtype=dtype, max_model_len=max_model_len,
                          max_batch_size=max_batch_size, seed=seed, width=width)  # fmt: skip

    def generate(self, prompt_token_ids, sampling):
        raise NotImplementedError

    def load_weights(self, weights, policy_version):
        raise NotImplementedError


PATH = f"{__name__}:Recording"


def spec(**changes) -> EngineSpec:
    fields = dict(engine_type=PATH, model_path="m", device="cpu", dtype="float32", max_model_len=64,
                  max_batch_size=4, options={"seed": 9, "in_process": True, "tensor_parallel_size": 1})  # fmt: skip
    return EngineSpec(**{**fields, **changes})


def test_an_engine_by_import_path_takes_what_it_declares_and_drops_context_it_has_no_use_for():
    engine = build_engine(spec(engine_options={"width": 3}))
    assert engine.built == dict(model_path="m", device="cpu", dtype="float32", max_model_len=64, max_batch_size=4,
                                seed=9, width=3)  # fmt: skip


def test_a_setting_the_engine_would_ignore_is_refused_naming_its_key():
    with pytest.raises(ValueError, match=r"^explorer.rollout_model.engine_options.depth: not an option of the "
                       r"Recording engine \(its options: seed, width\)$"):  # fmt: skip
        build_engine(spec(engine_options={"depth": 2}))
    with pytest.raises(ValueError, match=r"^explorer.rollout_model.tensor_parallel_size: the Recording engine has no "
                       r"such setting .* leave it at 1 or choose another engine$"):  # fmt: skip
        build_engine(spec(options={"tensor_parallel_size": 2}))
    hf = engine_class("hf")  # the built-in engines by the same rule (nothing is built here)
    assert engine_options(hf, {"enforce_eager": True, "seed": 1, "in_process": True}, {}) == {"enforce_eager": True}
    with pytest.raises(ValueError, match=r"enable_sleep_mode: the HFEngine engine has no such setting"):
        engine_options(hf, {"enable_sleep_mode": True}, {})


def test_an_import_path_must_name_an_engine_and_the_spec_crosses_processes_as_json():
    with pytest.raises(ValueError, match=r"is not a RolloutEngine subclass"):
        engine_class(f"{__name__}:spec")
    with pytest.raises(ValueError, match=r"'nope' is not one of hf, vllm, tinker \(nor an import path"):
        engine_class("nope")
    original = spec(engine_options={"width": 2})
    assert EngineSpec.from_json(original.to_json()) == original
    assert EngineSpec.from_json(original.to_json()).with_model("other").model_path == "other"
    with pytest.raises(ValueError, match=r"^--engine-spec is not an engine spec"):
        EngineSpec.from_json('{"engine_type": "hf"}')


def test_an_engine_of_yours_takes_the_shared_settings_it_declares_and_in_process_engines_run_unsplit(recipe: str):
    """The config checks refuse vLLM's settings on the registered engines without them, not on an
    engine by import path (its constructor decides as it is built); an engine in a trainer rank's
    process runs on that rank's device, whatever tensor parallelism the rollout workers take."""
    from rlcore.core.config import load_config, resolve_stages

    tp2 = [f"explorer.rollout_model.engine_type={PATH}", "explorer.rollout_model.tensor_parallel_size=2"]
    (stage,) = resolve_stages(load_config(recipe, tp2), check_paths=False)
    workers = engine_spec(stage.config, "m", "cpu", "float32", seed=3)
    assert workers.engine_type == PATH and workers.options["tensor_parallel_size"] == 2
    assert workers.options["seed"] == 3 and "service_url" not in workers.options
    in_process = engine_spec(stage.config, "m", "cpu", "float32", seed=3, in_process=True).options
    assert in_process["tensor_parallel_size"] == 1 and in_process["in_process"] is True
    assert "in_process" not in workers.options
