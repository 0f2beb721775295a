"""Errors a user can fix. The CLI prints their message as one line and exits with code 2."""


class SkipsearchError(Exception):
    """Base class: bad input or a missing resource, with a message that names the fix."""


class InvalidMaskError(SkipsearchError):
    """A skip mask that does not fit the model or cannot draft anything."""


class ModelLoadError(SkipsearchError):
    """A model that cannot be found, fetched, converted or run layer by layer."""


class PromptError(SkipsearchError):
    """A prompt set that is missing, empty or malformed."""


class ConfigError(SkipsearchError):
    """An invalid option value, search space or run directory."""
