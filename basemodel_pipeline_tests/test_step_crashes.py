"""A step whose process crashes in native code (defs/shared/step_failures.py, entrypoints/_common.py).

Real processes and real Dagster: the crash is a real SIGSEGV (``ctypes.string_at(0)``), the entrypoint's
faulthandler writes the Python stack, and a real asset materialization retries the step once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from basemodel_pipeline.defs.shared.step_failures import CRASH_RETRIES, crash_signal, raise_step_failure

# A Pipes step that dies of SIGSEGV until its marker file exists (the first attempt creates it), then reports.
CRASH_ONCE = """
import ctypes, sys
from pathlib import Path
from dagster_pipes import open_dagster_pipes
marker = Path(sys.argv[1])
if sys.argv[2] == "always" or not marker.exists():
    marker.write_text("crashed")
    ctypes.string_at(0)  # SIGSEGV
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"attempt": "second"})
"""


def test_the_crash_signal_is_read_from_the_clients_error() -> None:
    assert crash_signal(RuntimeError("External execution process failed with code -11")) is signal.SIGSEGV
    assert crash_signal(RuntimeError("Container exited with non-zero status code: {'StatusCode': 134}")) is (
        signal.SIGABRT
    )
    for not_a_crash in (
        "External execution process failed with code 1",  # a Python exception
        "External execution process failed with code -9",  # SIGKILL: the OOM killer, or an operator
        "External execution process failed with code -15",  # SIGTERM: a cancellation
        "Container exited with non-zero status code: {'StatusCode': 2}",  # a user error
        "External execution process failed with code -99",  # no such signal
        "something else entirely",
    ):
        assert crash_signal(RuntimeError(not_a_crash)) is None, not_a_crash


def test_an_entrypoint_that_crashes_prints_its_python_stack(tmp_path: Path, tiny_config: Path) -> None:
    """faulthandler is on in every entrypoint: a segmentation fault leaves the stack of the stage function."""
    script = tmp_path / "stage.py"
    script.write_text(
        textwrap.dedent(
            """
            import ctypes, sys
            from basemodel_pipeline.entrypoints._common import main

            def fit_the_native_library(cfg, args, progress):
                ctypes.string_at(0)

            main("toy", fit_the_native_library, ["--config", sys.argv[1]])
            """
        )
    )
    command = [sys.executable, str(script), str(tiny_config)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert "fit_the_native_library" in done.stderr, done.stderr


def _asset(tmp_path: Path, mode: str) -> dg.AssetsDefinition:
    @dg.asset(name=f"crashing_{mode}")
    def crashing(context):  # noqa: ANN001  (a local asset: Dagster reads the hint unresolved)
        command = [sys.executable, "-c", CRASH_ONCE, str(tmp_path / f"{mode}.marker"), mode]
        try:
            return dg.PipesSubprocessClient().run(context=context, command=command).get_materialize_result()
        except Exception as err:  # what Launcher.run does with a failed step
            raise_step_failure(context, "toy", err)
            raise

    return crashing


def _messages(result: dg.ExecuteInProcessResult) -> list[str]:
    return [e.message or "" for e in result.all_events if e.message]


def test_a_step_that_crashes_once_is_retried_and_succeeds(tmp_path: Path) -> None:
    with dg.instance_for_test() as instance:
        result = dg.materialize([_asset(tmp_path, "once")], instance=instance)
        assert result.success
        [mat] = result.asset_materializations_for_node("crashing_once")
        assert mat.metadata["attempt"].value == "second"
        events = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        assert len(events) == 1
        logs = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
        assert any("died of SIGSEGV (a crash in native code, attempt 1); retrying" in m for m in logs), logs


def test_a_step_that_crashes_every_time_fails_after_one_retry(tmp_path: Path) -> None:
    with dg.instance_for_test() as instance:
        result = dg.materialize([_asset(tmp_path, "always")], instance=instance, raise_on_error=False)
        assert not result.success
        retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        assert len(retries) == CRASH_RETRIES
        [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        description = failure.step_failure_data.user_failure_data.description
        assert "died of SIGSEGV (a crash in native code, attempt 2), again after 1 retry" in description
        assert "faulthandler" in description


def test_a_user_error_is_not_retried(tmp_path: Path) -> None:
    @dg.asset
    def user_mistake(context):  # noqa: ANN001
        command = [sys.executable, "-c", "import sys; sys.exit(2)"]
        try:
            dg.PipesSubprocessClient().run(context=context, command=command)
        except Exception as err:
            raise_step_failure(context, "toy", err)
            raise

    with dg.instance_for_test() as instance:
        result = dg.materialize([user_mistake], instance=instance, raise_on_error=False)
        assert not result.success
        assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


@pytest.mark.parametrize("code", [-9, -15])
def test_kills_and_cancellations_are_not_crashes(code: int) -> None:
    assert crash_signal(RuntimeError(f"External execution process failed with code {code}")) is None
