"""The sections of `algorithm` that only some algorithms read (core/algorithms SECTION_READERS: one
per algorithm, opmd, maxent_grpo, mix and dpo, and the length term): one set where nothing reads it
is refused in one line, as a DPO knob on a GRPO run changes nothing.

A stage that sets a section's key itself must read it; a section set run-wide must be read by the
run (its one stage, or any of its stages: the others inherit it unread, as they inherit every setting).
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .schema import ALGORITHM_SECTIONS, AlgorithmConfig


def check_algorithm_sections(
    run: AlgorithmConfig, stages: list[tuple[str, AlgorithmConfig, dict[str, Any]]]
) -> None:
    """`run`: the run-wide algorithm section; `stages`: each stage's key prefix (`stages[1].`), its
    resolved algorithm and what it sets under `algorithm` itself (plain data). With no `stages`
    list, pass the run as its one stage, prefix "" and nothing of its own."""
    from ..algorithms import SECTION_READERS, sections_read  # torch-free; imported where used (no cycle)

    default = AlgorithmConfig()
    read_by = [sections_read(algo) for _, algo, _ in stages]
    if any(read is None for read in read_by):
        return  # an algorithm of your own may read any section
    single = len(stages) == 1 and not stages[0][0]
    for (prefix, algo, own), read in zip(stages, read_by, strict=True):
        for section in SECTION_READERS:
            keys = None if single else own.get(section)
            if section in read or not isinstance(keys, dict):  # type: ignore[operator]
                continue
            changed = [k for k in keys if _value(algo, section, k) != _value(default, section, k)]
            if changed:
                readers = [p for (p, _, _), r in zip(stages, read_by, strict=True) if section in r]  # type: ignore[operator]
                raise ConfigError(_unread(prefix, section, changed[0], algo, readers))
    for section in SECTION_READERS:
        changed = [
            k
            for k in vars(getattr(default, section))
            if _value(run, section, k) != _value(default, section, k)
        ]
        if changed and not any(section in read for read in read_by):  # type: ignore[operator]
            owner = next((s for s in stages if s[1].algorithm_type == section), None)  # its parts replaced
            if single or owner is not None:
                prefix, algo, _ = owner or stages[0]
                raise ConfigError(_unread(prefix, section, changed[0], algo, [], run_wide=not single))
            types = ", ".join(dict.fromkeys(a.algorithm_type for _, a, _ in stages))
            raise ConfigError(_unread_by_all(section, changed[0], types))


def _value(algo: AlgorithmConfig, section: str, key: str) -> Any:
    return getattr(getattr(algo, section), key, None)


def _what(section: str) -> tuple[str, str]:
    """What reads `section` (a line's words) and, for a section of one algorithm, whose it is."""
    from ..algorithms import SECTION_READERS

    named = section in ALGORITHM_SECTIONS
    return " or ".join(SECTION_READERS[section]), (f" (algorithm_type {section}'s)" if named else "")


def _unread(
    prefix: str, section: str, key: str, algo: AlgorithmConfig, readers: list[str], run_wide: bool = False
) -> str:
    """One line for a stage (`prefix`) whose algorithm does not read `section`: why, and the fix:
    the stage that reads it where one does (`readers`), else the algorithm_type that would."""
    from ..algorithms import ALGORITHMS, SECTION_READERS

    what, whose = _what(section)
    where = "" if run_wide else prefix
    drop = f"drop {where}algorithm.{section} (or set {where}algorithm.{section}.{key} back to {_value(AlgorithmConfig(), section, key)!r})"
    preset = ALGORITHMS.get(section)
    replaced = [
        part
        for part in ("advantage_fn", "policy_loss_fn")
        if preset is not None and algo.algorithm_type == section
        and f"{part} {getattr(preset, part)}" in SECTION_READERS[section] and getattr(algo, part) != getattr(preset, part)
    ]  # fmt: skip
    if replaced:
        this = f"{prefix}algorithm." + " and ".join(f"{part} is {getattr(algo, part)}" for part in replaced)
        fix = f"remove {prefix}algorithm.{' and '.join(replaced)} (algorithm_type {section}'s own reads it)"
    elif section in ALGORITHM_SECTIONS:
        this = f"{prefix}algorithm.algorithm_type is {algo.algorithm_type}"
        fix = f"set {prefix}algorithm.algorithm_type {section}"
    else:
        this = f"{prefix}algorithm.algorithm_type {algo.algorithm_type} computes no advantage of rollouts' rewards"
        fix = f"set {prefix}algorithm.algorithm_type to an RL algorithm"
    if readers:  # another stage reads it: that is where it belongs
        fix = f"move it to {readers[0]}algorithm.{section}"
    return f"{where}algorithm.{section}.{key}: algorithm.{section} is read only by {what}{whose}, and {this} (it would change nothing): {fix}, or {drop}"


def _unread_by_all(section: str, key: str, types: str) -> str:
    """One line for a section set run-wide that no stage's algorithm reads."""
    what, whose = _what(section)
    fix = (
        f"set algorithm_type {section} on the stage that should read it (stages[N].algorithm.algorithm_type)"
        if section in ALGORITHM_SECTIONS
        else "train an RL algorithm in one of the stages"
    )
    default = _value(AlgorithmConfig(), section, key)
    return (
        f"algorithm.{section}.{key}: algorithm.{section} is read only by {what}{whose}, and no stage's "
        f"algorithm_type ({types}) reads it (it would change nothing): {fix}, or drop algorithm.{section} (or set "
        f"algorithm.{section}.{key} back to {default!r})"
    )
