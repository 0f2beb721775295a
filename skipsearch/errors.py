"""Errors a user can fix. The CLI prints their message as one line and exits with code 2.

Each is a `ValueError` (a bad value) or, for an argument of the wrong type given to the Python
API, a `TypeError` too, so a caller's `except ValueError` catches what it expects.
"""


class SkipsearchError(Exception):
    """Base class: bad input or a missing resource, with a message that names the fix."""


class InvalidMaskError(SkipsearchError, ValueError):
    """A skip mask that does not fit the model or cannot draft anything."""


class ModelLoadError(SkipsearchError, ValueError):
    """A model that cannot be found, fetched, converted or run layer by layer."""


class PromptError(SkipsearchError, ValueError):
    """A prompt set that is missing, empty or malformed."""


class ConfigError(SkipsearchError, ValueError):
    """An invalid option value, search space or run directory."""


class SettingTypeError(SkipsearchError, TypeError):
    """An argument of the Python API of the wrong type (None, a number for a name, a string for a list)."""
