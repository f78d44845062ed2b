"""The one error type of config loading and checking."""


class ConfigError(ValueError):
    """A user-facing config problem; str(e) is one line naming the key path and the fix."""
