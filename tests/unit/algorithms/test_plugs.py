"""The algorithm's plug points by import path fail `config validate` in one line naming the key,
before any step: a path that does not import, an object that is not an Algorithm, an advantage
function or policy loss whose output has the wrong shape or no gradient."""

from __future__ import annotations

import pytest

from tests.unit.config.minimal import resolve

PARTS = "tests.unit.algorithms.user_parts"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"algorithm.algorithm_type={PARTS}:NOT_AN_ALGORITHM"], rf"^algorithm\.algorithm_type '{PARTS}:NOT_AN_ALGORITHM' is not an Algorithm \(got 42\)"),
        (["algorithm.algorithm_type=no_such_pkg.mod:ALGO"], r"^algorithm\.algorithm_type 'no_such_pkg\.mod:ALGO': cannot import module 'no_such_pkg\.mod'"),
        ([f"algorithm.advantage_fn={PARTS}:two_values"], rf"^algorithm\.advantage_fn '{PARTS}:two_values' returned \(2,\) for 4 responses of up to 3 tokens; return a tensor of shape \[N\]"),
        ([f"algorithm.advantage_fn={PARTS}:missing"], rf"^algorithm\.advantage_fn '{PARTS}:missing': module '{PARTS}' has no attribute 'missing'$"),
        ([f"algorithm.policy_loss_fn={PARTS}:detached_pg"], rf"^algorithm\.policy_loss_fn '{PARTS}:detached_pg': its per-token loss does not depend on the log-probs"),
        (["algorithm.advantage_fn=grpoo"], r"^algorithm\.advantage_fn must be one of grpo, .* \(or an import path 'pkg\.mod:name'\); got 'grpoo'$"),
    ],
)  # fmt: skip
def test_a_part_of_ones_own_that_cannot_train_fails_validation_naming_the_key(
    tmp_path, overrides: list[str], message: str
) -> None:
    from rlcore.core.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, *overrides)


def test_parts_of_ones_own_that_work_pass_validation(tmp_path) -> None:
    cfg = resolve(tmp_path, *[
        f"algorithm.algorithm_type={PARTS}:TEACHER_GRPO", f"algorithm.advantage_fn={PARTS}:centred",
        f"algorithm.policy_loss_fn={PARTS}:vanilla_pg",
    ])  # fmt: skip
    assert cfg.algorithm.advantage_fn == f"{PARTS}:centred"
