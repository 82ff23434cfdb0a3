"""User-facing errors: anything a user can fix (config, data, arguments) raises UserError.

The CLI and the Pipes entrypoints print ``str(error)`` as one line and exit non-zero, with no traceback.
"""


class UserError(Exception):
    """A mistake the user can fix. The message names the file/field/value and what to do."""


class ConfigError(UserError):
    """The YAML config is invalid (wrong key, type, value, or inconsistent with the data)."""


class DataError(UserError):
    """The data does not match what the config says (missing column, unparsable date, keys never match)."""


class StepUserError(UserError):
    """A UserError leaving a Pipes step: its message is the step's one line (``"<stage>: <what to do>"``).

    It closes the Pipes session, so its class name and message reach the orchestrator in the Pipes messages
    themselves, on every launcher (subprocess, Docker, Kubernetes, ECS): nothing else is shared with the step.
    """
