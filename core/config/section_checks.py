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
    single = len(stages) == 1 and not stages[0][0]
    for (prefix, algo, own), read in zip(stages, read_by, strict=True):
        for section in SECTION_READERS:
            keys = own.get(section) if not single else None
            if read is None or section in read or not isinstance(keys, dict):
                continue
            changed = [
                k
                for k in keys
                if getattr(getattr(algo, section), k, None) != getattr(getattr(default, section), k, None)
            ]
            if changed:
                raise ConfigError(_unread(prefix, section, changed[0], [algo], SECTION_READERS[section]))
    known = [read for read in read_by if read is not None]
    if len(known) < len(read_by):
        return  # an algorithm of your own may read any section
    for section in SECTION_READERS:
        values, defaults = getattr(run, section), getattr(default, section)
        changed = [k for k in vars(defaults) if getattr(values, k) != getattr(defaults, k)]
        if changed and not any(section in read for read in known):
            raise ConfigError(
                _unread("", section, changed[0], [a for _, a, _ in stages], SECTION_READERS[section], single)
            )


def _unread(
    prefix: str,
    section: str,
    key: str,
    algos: list[AlgorithmConfig],
    readers: tuple[str, ...],
    single: bool = True,
) -> str:
    """One line: what reads the section, why this stage's (or no stage's) algorithm does not, the fix."""
    default = getattr(getattr(AlgorithmConfig(), section), key)
    drop = f"drop {prefix}algorithm.{section} (or set {prefix}algorithm.{section}.{key} back to {default!r})"
    named = section in ALGORITHM_SECTIONS
    whose = f" (algorithm_type {section}'s)" if named else ""
    if not single:  # set run-wide, read by no stage
        types = ", ".join(dict.fromkeys(a.algorithm_type for a in algos))
        this = f"no stage's algorithm_type ({types}) reads it"
        fix = f"set it on the stage whose algorithm reads it (stages[N].algorithm.{section})"
    else:
        (algo,) = algos
        replaced = [f"{part} is {getattr(algo, part)}" for part in ("advantage_fn", "policy_loss_fn")
                    if getattr(algo, part) is not None and algo.algorithm_type == section]  # fmt: skip
        if replaced:
            this = f"{prefix}algorithm.{' and '.join(replaced)}"
            fix = f"leave {prefix}algorithm.advantage_fn and policy_loss_fn to algorithm_type {section}"
        elif named:
            this = f"{prefix}algorithm.algorithm_type is {algo.algorithm_type}"
            fix = f"set {prefix}algorithm.algorithm_type {section}"
        else:
            this = f"{prefix}algorithm.algorithm_type {algo.algorithm_type} trains on no rollouts"
            fix = "set it on a stage of an RL algorithm"
    return (
        f"{prefix}algorithm.{section}.{key}: algorithm.{section} is read only by {' or '.join(readers)}{whose}, "
        f"and {this} (it would change nothing): {fix}, or {drop}"
    )
