"""Retry policy: transient failures back off exponentially with jitter; permanent ones fail at once."""

from __future__ import annotations

import pytest

from basemodel_pipeline.errors import DataError
from basemodel_pipeline.retry import Unavailable, with_retry
from basemodel_pipeline.sources.base import Backend


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


def test_transient_failures_are_retried_with_bounded_growing_delays() -> None:
    fn = Flaky([ConnectionResetError("connection reset by peer"), TimeoutError("read timed out")])
    delays: list[float] = []
    result = with_retry(fn, what="source 'ev' (x)", is_transient=Backend.is_transient, sleep=delays.append)
    assert result == "ok" and fn.calls == 3
    assert len(delays) == 2
    assert 0 <= delays[0] <= 0.5 and 0 <= delays[1] <= 1.0  # full jitter under base * 2**(attempt-1)


def test_permanent_failure_is_not_retried() -> None:
    fn = Flaky([PermissionError("Incorrect username or password was specified.")])
    delays: list[float] = []
    with pytest.raises(DataError) as info:
        with_retry(
            fn, what="source 'ev' (snowflake:EVENTS)", is_transient=Backend.is_transient, sleep=delays.append
        )
    assert fn.calls == 1 and delays == []
    assert str(info.value).startswith("source 'ev' (snowflake:EVENTS): Incorrect username or password")


def test_retries_stop_after_the_last_attempt() -> None:
    fn = Flaky([ConnectionRefusedError("connection refused")] * 10)
    delays: list[float] = []
    with pytest.raises(Unavailable, match="still failing after 3 attempts"):
        with_retry(
            fn, what="source 'ev' (x)", is_transient=Backend.is_transient, attempts=3, sleep=delays.append
        )
    assert fn.calls == 3 and len(delays) == 2


def test_error_words_decide_transience() -> None:
    assert Backend.is_transient(RuntimeError("HTTP 503 Service Unavailable"))
    assert Backend.is_transient(RuntimeError("429 Too Many Requests"))
    assert not Backend.is_transient(RuntimeError("Table 'EVENTS' does not exist or not authorized."))
    assert not Backend.is_transient(DataError("source 'x': column y not found"))


@pytest.mark.parametrize("port", [54037, 14013, 55030, 44290, 18456, 41205])
def test_a_status_code_inside_a_port_number_decides_nothing(port: int) -> None:
    """Codes such as 403 (permanent) or 503 (transient) count as whole numbers, never as digits of a port."""
    from basemodel_pipeline.sources import backend_class

    refused = RuntimeError(
        f"HTTPConnectionPool(host='127.0.0.1', port={port}): Max retries exceeded with url: /sql "
        "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection refused'))"
    )
    rejected = RuntimeError(f"HTTPConnectionPool(host='127.0.0.1', port={port}): invalid statement")
    for kind in ("databricks", "synapse", "parquet", "snowflake"):
        cls = backend_class(kind)
        assert cls.is_transient(refused), (kind, port)
        assert not cls.is_transient(rejected), (kind, port)
    assert backend_class("databricks").is_transient(RuntimeError("HTTP 503 from the warehouse"))
    assert not backend_class("databricks").is_transient(RuntimeError("HTTP Error 403: Forbidden"))
    assert not backend_class("synapse").is_transient(RuntimeError("Login failed (18456)"))
    assert backend_class("synapse").is_transient(RuntimeError("Error 40613: database unavailable"))
