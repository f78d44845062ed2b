"""Keys of rlcore's own that moved: a config written with the old key still loads, with a one-line
note naming the new one.

The knobs that one algorithm reads live in that algorithm's section (`algorithm.dpo.beta`, was
`algorithm.dpo_beta`; schema/algorithm.py ALGORITHM_SECTIONS). The loader rewrites an old key where
the config sets it (the recipe's `algorithm`, a stage's, a `key=value` override) before any check
reads the config, so every check and error speaks of the new key.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

MOVED: dict[str, tuple[str, str]] = {
    # old key under `algorithm` -> (its section, its key there)
    "opmd_tau": ("opmd", "tau"),
    "opmd_baseline": ("opmd", "baseline"),
    "maxent_tau": ("maxent_grpo", "tau"),
    "maxent_q_temperature": ("maxent_grpo", "q_temperature"),
    "maxent_q_epsilon": ("maxent_grpo", "q_epsilon"),
    "maxent_length_normalize_ref": ("maxent_grpo", "length_normalize_ref"),
    "mix_mu": ("mix", "mu"),
    "mix_expert_ratio": ("mix", "expert_ratio"),
    "dpo_beta": ("dpo", "beta"),
    "dpo_label_smoothing": ("dpo", "label_smoothing"),
    "dpo_nll_coef": ("dpo", "nll_coef"),
    "dpo_pairs": ("dpo", "pairs"),
    "dpo_nll_norm": ("dpo", "nll_norm"),
}


def move_keys(data: dict[str, Any], where: str = "") -> list[str]:
    """Rewrite the old keys of a config's plain data (a recipe, or one override layer) in place:
    its `algorithm` section's and each stage's (`stages` as a list, or an override's mapping of
    indices). Returns one note per key moved. ConfigError (starting with `where`: the file, or
    "override: ") when a section sets a key both ways."""
    notes = _move_algorithm(data.get("algorithm"), "algorithm", where)
    stages = data.get("stages")
    items = (
        stages.items() if isinstance(stages, dict) else enumerate(stages) if isinstance(stages, list) else ()
    )
    for i, stage in items:
        if isinstance(stage, dict):
            notes += _move_algorithm(stage.get("algorithm"), f"stages[{i}].algorithm", where)
    return notes


def _move_algorithm(algo: Any, path: str, where: str) -> list[str]:
    if not isinstance(algo, dict):
        return []
    notes = []
    for old in [k for k in algo if k in MOVED]:
        section, key = MOVED[old]
        value = algo.pop(old)
        if algo.get(section) is None:  # absent, or written empty (`dpo:`)
            algo[section] = {}
        below = algo[section]
        if not isinstance(below, dict):  # the section itself is malformed: the schema check says so
            algo[old] = value
            continue
        if key in below and below[key] != value:
            raise ConfigError(
                f"{where}{path}.{old} ({value!r}) and {path}.{section}.{key} ({below[key]!r}) are the same "
                f"setting: keep {path}.{section}.{key}"
            )
        below[key] = value
        notes.append(
            f"{path}.{old} is {path}.{section}.{key} now (the old key still works; write the new one)"
        )
    return notes
