"""generator_args checked by the generator's own signature when the config loads: the key that is
wrong, and what it takes."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve

TS = "buffer.explorer_input.taskset"
EVAL = "buffer.explorer_input.eval_tasksets"
GEN = f"{TS}.generator=arithmetic"
CASES = [
    ([GEN, f"{TS}.generator_args={{part: validation}}"],
     rf"^{TS}\.generator_args\.part: generator 'arithmetic' takes one of train, test; got 'validation'$"),
    ([GEN, f"{TS}.generator_args={{num_task: 10}}"],
     rf"^{TS}\.generator_args\.num_task: not an argument of generator 'arithmetic' \(did you mean num_tasks\?\); "
     r"it takes part, num_tasks, max_operand, ops,"),
    ([GEN, f"{TS}.generator_args={{num_tasks: many}}"],
     rf"^{TS}\.generator_args\.num_tasks: generator 'arithmetic' takes an integer; got 'many'$"),
    ([GEN, f"{TS}.generator_args={{test_fraction: x}}"],
     rf"^{TS}\.generator_args\.test_fraction: generator 'arithmetic' takes a number; got 'x'$"),
    ([GEN, f"{TS}.generator_args={{preference_pairs: 1}}"],
     rf"^{TS}\.generator_args\.preference_pairs: generator 'arithmetic' takes true or false; got 1$"),
    ([f"{EVAL}=[{{path: e.jsonl, generator: verifiers, generator_args: {{take: 3}}}}]"],
     rf"^{EVAL}\[0\]\.generator_args\.env: required by generator 'verifiers' \(it takes env, env_args, skip, take\)$"),
    ([f"{EVAL}=[{{path: e.jsonl, generator: tool_arithmetic, generator_args: {{part: dev}}}}]"],
     rf"^{EVAL}\[0\]\.generator_args\.part: generator 'tool_arithmetic' takes one of train, test; got 'dev'$"),
    ([f"{TS}.generator=tests.unit.config.test_generator_args:my_generator", f"{TS}.generator_args={{size: big}}"],
     rf"^{TS}\.generator_args\.size: generator 'tests\.unit\.config\.test_generator_args:my_generator' takes an "
     r"integer or null; got 'big'$"),
]  # fmt: skip


def my_generator(path: str, size: int | None = None) -> None:
    """A user's generator, by import path."""


@pytest.mark.parametrize(("overrides", "pattern"), CASES, ids=[o[-1] for o, _ in CASES])
def test_wrong_generator_args_name_the_key_and_what_it_takes(
    tmp_path, overrides: list[str], pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        resolve(tmp_path, *overrides)


def test_right_generator_args_load(tmp_path) -> None:
    cfg = resolve(
        tmp_path, GEN, f"{TS}.generator_args={{part: test, num_tasks: 10, test_fraction: 1, seed: 3}}"
    )
    assert cfg.buffer.explorer_input.taskset.generator_args["part"] == "test"
    cfg = resolve(tmp_path, f"{TS}.generator=tests.unit.config.test_generator_args:my_generator")
    assert cfg.buffer.explorer_input.taskset.generator_args == {}
