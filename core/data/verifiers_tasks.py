"""taskset.generator verifiers: a verifiers environment's tasks as taskset rows, so rlcore's loop
batches, shuffles, repeats and holds out its tasks as any taskset's; the verifiers workflow
(rollout/workflows/verifiers.py) plays each row's task by its index in the environment's taskset."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import sys
from typing import Any

INDEX = "verifiers_index"
"""The row column holding the task's position in the environment's taskset."""


def verifiers_id(env: str) -> str:
    """The id verifiers loads `env` by: an installed environment's id as it is; a dotted module
    path (verifiers imports top-level names only) imported here and registered under its path
    with dots as underscores."""
    if "." not in env:
        return env
    alias = env.replace(".", "_")
    if alias not in sys.modules:
        try:
            sys.modules[alias] = importlib.import_module(env)
        except ImportError as e:
            raise ValueError(f"verifiers environment '{env}': cannot import it ({e})") from None
    return alias


def load_verifiers_taskset(env: str, env_args: dict[str, Any] | None = None) -> Any:
    """The verifiers taskset `env` names (an installed environment's id, or an importable module
    that exports its Taskset), configured by `env_args` (its taskset config's fields)."""
    try:
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import taskset_config_type
    except ImportError as e:
        raise ValueError(
            f"verifiers environments need the verifiers package ({e}): pip install 'rlcore[verifiers]'"
        ) from None
    env = verifiers_id(env)
    try:
        config = taskset_config_type(env).model_validate({"id": env, **(env_args or {})})
        return vf.load_taskset(config)
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        raise ValueError(f"verifiers environment '{env}': {type(e).__name__}: {e}") from None


def write_verifiers_taskset(
    path: str, env: str, env_args: dict[str, Any] | None = None, skip: int = 0, take: int | None = None
) -> None:
    """Write one row per task of `env`'s taskset, from task `skip` on, `take` of them (all of a
    bounded taskset when None): {"prompt": its prompt text, "verifiers_index": i}. Two files of the
    same environment with disjoint ranges share no task (a held-out part)."""
    if skip < 0 or (take is not None and take < 1):
        raise ValueError(f"skip must be >= 0 and take >= 1; got skip {skip}, take {take}")
    taskset = load_verifiers_taskset(env, env_args)
    if take is None and not taskset.bounded:
        raise ValueError(f"verifiers environment '{env}' has endless tasks: give take")
    stop = None if take is None else skip + take
    rows = [
        {"prompt": task.data.prompt_text if task.data.prompt is not None else "", INDEX: skip + i}
        for i, task in enumerate(itertools.islice(iter(taskset), skip, stop))
    ]
    if not rows:
        raise ValueError(f"verifiers environment '{env}' has no task from index {skip} on")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
