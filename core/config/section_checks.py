"""The per-algorithm sections of `algorithm` (schema ALGORITHM_SECTIONS: opmd, maxent_grpo, mix,
dpo): one set where no algorithm reads it is refused in one line, as a DPO knob on a GRPO run
changes nothing (core/algorithms SECTION_READERS says what reads each).

A stage that sets a section itself must read it; a section set run-wide must be read by the run
(one stage, or any of its stages: the others inherit it unread, as they inherit every setting).
"""

from __future__ import annotations

import dataclasses
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
    for (prefix, algo, own), read in zip(stages, read_by, strict=True):
        for section in ALGORITHM_SECTIONS:
            changed = _changed_key(getattr(algo, section), getattr(default, section))
            if read is not None and section not in read and section in own and changed is not None:
                path = f"{prefix}algorithm.{section}.{changed}"
                raise ConfigError(_unread(path, section, [algo.algorithm_type], SECTION_READERS[section]))
    known = [read for read in read_by if read is not None]
    if len(known) < len(read_by):
        return  # an algorithm of your own may read any section
    for section in ALGORITHM_SECTIONS:
        changed = _changed_key(getattr(run, section), getattr(default, section))
        if changed is not None and not any(section in read for read in known):
            types = list(dict.fromkeys(algo.algorithm_type for _, algo, _ in stages))
            raise ConfigError(
                _unread(f"algorithm.{section}.{changed}", section, types, SECTION_READERS[section])
            )


def _changed_key(section: Any, default: Any) -> str | None:
    return next(
        (f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)),
        None,
    )


def _unread(path: str, section: str, types: list[str], readers: tuple[str, ...]) -> str:
    this = (
        f"algorithm.algorithm_type is {types[0]}"
        if len(types) == 1
        else (f"the stages' algorithm_types are {', '.join(types)}")
    )
    return (
        f"{path}: algorithm.{section} is read only by {' or '.join(readers)} (algorithm_type {section}'s), "
        f"and {this} (it would change nothing): set algorithm.algorithm_type {section}, or drop algorithm.{section}"
    )
