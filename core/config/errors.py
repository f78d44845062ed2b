"""The one error type of config loading and checking."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing config problem; str(e) is one line naming the key path and the fix (several
    problems found in one pass, such as every unknown key of a file: one such line each)."""

    @classmethod
    def of(cls, problems: list[str]) -> ConfigError:
        """One error reporting every problem of `problems` (not empty), one line each."""
        assert problems
        return cls("\n".join(problems))
