"""What a failed Pipes step tells its asset: the user's one-line error, or a crash of the step's process.

    a user error   the entrypoint closed its Pipes session with a StepUserError (entrypoints/_common.py): the
                   asset fails with that line and is not retried (the same input fails the same way)
    a crash        the process died of a signal raised by native code (SIGSEGV, SIGBUS, SIGABRT, SIGILL,
                   SIGFPE): the step is retried once after a short wait, with a warning naming the signal;
                   the entrypoint's faulthandler has written the Python stack of every thread to its stderr
    anything else  the client's own error, unchanged (a Python exception in the step: exit code 1; a kill by
                   SIGKILL, usually the kernel's out-of-memory killer; a cancellation's SIGTERM/SIGINT)

A crash is read from the client's error: ``failed with code -11`` (a local process: minus the signal) or
``'StatusCode': 139`` (a container: 128 + the signal).
"""

from __future__ import annotations

import re
import signal

import dagster as dg

from basemodel_pipeline.errors import StepUserError

CRASH_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}
)  # a fault in native code, not a decision of the machine or of the user
CRASH_RETRIES = 1
CRASH_RETRY_WAIT_S = 5
_PROCESS_CODE = re.compile(r"failed with code (-\d+)")
_CONTAINER_CODE = re.compile(r"'StatusCode': (\d+)")


def step_user_error(context: dg.AssetExecutionContext) -> str | None:
    """The one line of the StepUserError that closed this step's Pipes session, if one did.

    Read from the run's event log, where Dagster records the exception of a Pipes "closed" message: the same
    path on every backend (a local process, a container, a pod, an ECS task), with no file shared."""
    step_key = str(context.op_handle)
    events = context.instance.all_logs(context.run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
    for entry in reversed(events):
        data = entry.dagster_event.engine_event_data if entry.dagster_event else None
        error = data.error if data else None
        if entry.step_key == step_key and error is not None and error.cls_name == StepUserError.__name__:
            # the message is "<module>.StepUserError: <line>\n" (traceback.format_exception_only)
            return error.message.split(f"{StepUserError.__name__}: ", 1)[-1].strip()
    return None


def crash_signal(error: BaseException) -> signal.Signals | None:
    """The signal that killed the step's process, when the client's error says one did and it is a crash."""
    text = str(error)
    number = None
    if match := _PROCESS_CODE.search(text):
        number = -int(match.group(1))
    elif (match := _CONTAINER_CODE.search(text)) and int(match.group(1)) > 128:
        number = int(match.group(1)) - 128
    try:
        found = signal.Signals(number) if number is not None else None
    except ValueError:
        return None
    return found if found in CRASH_SIGNALS else None


def raise_step_failure(context: dg.AssetExecutionContext, stage: str, error: Exception) -> None:
    """Turn a failed step's error into what the asset raises (module docstring); returns only when the
    error is neither a user error nor a crash (the caller re-raises it)."""
    message = step_user_error(context)
    if message:
        raise dg.Failure(description=message, allow_retries=False) from None
    crashed = crash_signal(error)
    if crashed is None:
        return
    attempt = context.retry_number + 1
    what = f"{stage}: the step's process died of {crashed.name} (a crash in native code, attempt {attempt})"
    if context.retry_number < CRASH_RETRIES:
        context.log.warning(f"{what}; retrying in {CRASH_RETRY_WAIT_S} s. Its Python stack is in its stderr")
        raise dg.RetryRequested(max_retries=CRASH_RETRIES, seconds_to_wait=CRASH_RETRY_WAIT_S) from error
    raise dg.Failure(
        description=f"{what}, again after {CRASH_RETRIES} retry; its Python stack is in the step's stderr "
        "(faulthandler). Report it with that stack and the versions of torch and lightgbm",
        allow_retries=False,
    ) from error
