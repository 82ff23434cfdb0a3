"""User-facing errors: anything a user can fix (config, data, arguments) raises UserError.

The CLI and the Pipes entrypoints print ``str(error)`` as one line and exit non-zero, with no traceback.
"""


class UserError(Exception):
    """A mistake the user can fix. The message names the file/field/value and what to do."""


class ArgumentError(UserError):
    """A bad argument of a library call, named as the library spells it: ``as_of 2019-12-31: <what to do>``.

    A face that spells its arguments otherwise re-words the message with :meth:`named` (the CLI writes
    ``--as-of 2019-12-31: ...``); the Pipes entrypoints and Dagster run config use the library's names.
    """

    def __init__(self, argument: str, value: object, detail: str) -> None:
        self.argument, self.value, self.detail = argument, value, detail
        super().__init__(self.named(argument))

    def named(self, name: str) -> str:
        """The message with the argument called `name`."""
        shown = "" if self.value is None else f" {self.value}"
        return f"{name}{shown}: {self.detail}"

    def __reduce__(self) -> tuple[type, tuple[str, object, str]]:  # pickles across worker processes
        return type(self), (self.argument, self.value, self.detail)


class ConfigError(UserError):
    """The YAML config is invalid (wrong key, type, value, or inconsistent with the data)."""


class DataError(UserError):
    """The data does not match what the config says (missing column, unparsable date, keys never match)."""


class StepUserError(UserError):
    """A UserError leaving a Pipes step: its message is the step's one line (``"<stage>: <what to do>"``).

    It closes the Pipes session, so its class name and message reach the orchestrator in the Pipes messages
    themselves, on every launcher (subprocess, Docker, Kubernetes, ECS): nothing else is shared with the step.
    """
