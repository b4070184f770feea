"""Every error a user can cause derives from EdgespecError.

The CLI maps these to a one-line message and a non-zero exit; anything else is
a bug and keeps its traceback.
"""


class EdgespecError(Exception):
    """Base class: a problem the user can fix; the message says how."""


class ModelError(EdgespecError):
    """A model file or registry entry is missing, corrupt or does not match its digest."""


class IncompatibleDraftError(EdgespecError):
    """A draft model cannot verify against this target (vocabulary or special tokens differ)."""


class ContextOverflowError(EdgespecError):
    """The prompt (plus what must be generated) does not fit the context window."""


class UnsupportedError(EdgespecError):
    """A setting this mode cannot honour exactly; refused rather than silently changed."""


class InvalidInputError(EdgespecError):
    """Bad request input: invalid UTF-8, empty prompt, out-of-range parameter."""


class Cancelled(EdgespecError):
    """The request was cancelled by the caller."""


def ensure(ok: object, message: str) -> None:
    """Raise InvalidInputError(message) unless ``ok``: the one-line check that settings and
    parameter classes validate their fields with."""
    if not ok:
        raise InvalidInputError(message)
