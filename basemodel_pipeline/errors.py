"""User-facing errors: anything a user can fix (config, data, arguments) raises UserError.

The CLI and the Pipes entrypoints print ``str(error)`` as one line and exit non-zero, with no traceback.
"""


class UserError(Exception):
    """A mistake the user can fix. The message names the file/field/value and what to do."""


class ConfigError(UserError):
    """The YAML config is invalid (wrong key, type, value, or inconsistent with the data)."""


class DataError(UserError):
    """The data does not match what the config says (missing column, unparsable date, keys never match)."""
