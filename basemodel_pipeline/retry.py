"""Calls to remote services (warehouses, object stores) retried with bounded exponential backoff.

Failures are sorted into transient (a refused, reset or timed-out connection, throttling, HTTP 5xx: retried)
and permanent (credentials, a missing table, bad SQL: fail at once). The wait before attempt n+1 is drawn
between half and all of ``base * 2**(n-1)`` (at most 30 s): it grows from one attempt to the next, and the
jitter keeps many workers from coming back at the same instant. BASEMODEL_SOURCE_ATTEMPTS (default 5) and
BASEMODEL_SOURCE_RETRY_BASE_S (default 0.5) set the policy for every source, output and upload.

Every failure ends in one DataError line that starts with `what` (the source, output or URL); when the
connection itself failed it names `where` (host:port, never credentials) and what to check. Each retry is
logged as one warning line. Known secret values are masked in every message.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

from basemodel_pipeline.errors import DataError
from basemodel_pipeline.settings import setting

T = TypeVar("T")
log = logging.getLogger(__name__)

ATTEMPTS = 5
BASE_DELAY_S = 0.5
MAX_DELAY_S = 30.0
# a connection that was never made or was cut: drivers say it in their own words, often wrapped
CONNECTION_WORDS = (
    "connection refused",
    "connection reset",
    "connection aborted",
    "timed out",
    "could not connect",
    "failed to connect",
    "failed to establish a new connection",
    "network_connection",
    "broken pipe",
    "connect timeout",
    "receiving data from the peer",
    "sending data to the peer",
    "empty reply from server",
    "server returned nothing",
    "closed connection without response",
)
TRANSIENT_WORDS = (
    *CONNECTION_WORDS,
    "timeout",
    "temporarily unavailable",
    "service unavailable",
    "service is unavailable",
    "too many requests",
    "throttl",
    "rate limit",
    "slowdown",
    "503",
    "502",
    "504",
    "429",
)
CONNECTION_ADVICE = (
    "check that {where} is the right host and port, that the server is up and that this machine can reach it "
    "(firewall, proxy, VPN), then retry"
)
MASK = "***"
MIN_SECRET_CHARS = 4  # shorter values would mask ordinary text


class Unavailable(DataError):
    """A remote service kept failing with transient errors after every retry."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def causes(exc: BaseException) -> Iterator[BaseException]:
    """exc, then what it was raised from or while handling, down the chain (each exception once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def connection_failure(exc: BaseException) -> BaseException | None:
    """The refused, reset or timed-out connection behind exc (the deepest one in its chain), or None.

    Drivers wrap it: Snowflake's OperationalError 250001 over requests over ConnectionRefusedError, DuckDB's
    IOException "Could not connect to server", botocore's EndpointConnectionError, pyarrow's OSError
    "NETWORK_CONNECTION". A user error (DataError) is never one."""
    if isinstance(exc, DataError):
        return None
    found = None
    for e in causes(exc):
        builtin = isinstance(e, ConnectionError | TimeoutError)  # the deepest of these wins
        if builtin or (found is None and any(word in str(e).lower() for word in CONNECTION_WORDS)):
            found = e
    return found


ENDPOINT_PORT = re.compile(r"(?:\bport\s*[=:]?\s*|(?<=[\w\]]):)\d+")


def mentions(text: str, words: Iterable[str]) -> bool:
    """Whether text holds any of words, case aside; a number counts only whole and never as a port
    (403 is not in "port=54037", nor 18456 in "127.0.0.1:18456")."""
    text = ENDPOINT_PORT.sub(" ", text.lower())
    for word in words:
        word = word.lower()
        if word.isdigit():
            if re.search(rf"(?<!\d){word}(?!\d)", text):
                return True
        elif word in text:
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """Whether retrying can help, judged from the exception's type and words (drivers refine it)."""
    if isinstance(exc, DataError):
        return False
    if connection_failure(exc) is not None:
        return True
    return mentions(str(exc), TRANSIENT_WORDS)


def host_port(url: str | None, default_port: int | None = None) -> str | None:
    """``host:port`` of a URL or of a bare ``host[:port]`` (user and password dropped)."""
    if not url:
        return None
    parts = urlsplit(url if "://" in url else f"//{url}")
    if not parts.hostname:
        return None
    scheme_port = {"https": 443, "http": 80}.get(parts.scheme)
    port = parts.port or default_port or scheme_port
    return f"{parts.hostname}:{port}" if port else parts.hostname


def mask(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, MASK)
    return text


def reason(exc: BaseException) -> str:
    """The driver's first line, plus the refused/reset/timed-out connection beneath it when that says more."""
    text = first_line(exc)
    root = connection_failure(exc)
    if root is not None and root is not exc:
        extra = first_line(root)
        if extra not in text:
            text = f"{text} ({extra})"
    return text


def backoff_delay(attempt: int, base_delay: float, max_delay: float = MAX_DELAY_S) -> float:
    """The wait after failed attempt `attempt` (1-based): between half and all of base * 2**(attempt-1)."""
    cap = min(max_delay, base_delay * 2 ** (attempt - 1))
    return random.uniform(cap / 2, cap)


def with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    is_transient: Callable[[BaseException], bool] = is_transient,
    where: str | None = None,
    secrets: Iterable[str] = (),
    attempts: int | None = None,
    base_delay: float | None = None,
    max_delay: float = MAX_DELAY_S,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Call fn; retry transient failures with growing, jittered waits; fail fast otherwise.

    Every failure ends in a DataError whose message starts with `what`, on one line; a connection that
    kept failing is reported with `where` (host:port) and what to check. Connection parameters are never
    formatted into a message, and the `secrets` given are masked in the driver's words.
    """
    attempts = attempts or int(setting("BASEMODEL_SOURCE_ATTEMPTS", str(ATTEMPTS)))
    if base_delay is None:
        base_delay = float(setting("BASEMODEL_SOURCE_RETRY_BASE_S", str(BASE_DELAY_S)))
    secrets = [s for s in secrets if s]
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if isinstance(exc, DataError) and not isinstance(exc, Unavailable):
                raise
            why = mask(reason(exc), secrets)
            if not is_transient(exc):
                raise DataError(f"{what}: {why} (permanent error: not retried)") from exc
            if attempt == attempts:
                raise Unavailable(final_message(what, where, attempts, why, exc)) from exc
            delay = backoff_delay(attempt, base_delay, max_delay)
            log.warning(
                "%s: attempt %d of %d failed (%s); retrying in %.1f s", what, attempt, attempts, why, delay
            )
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")


def final_message(what: str, where: str | None, attempts: int, why: str, exc: BaseException) -> str:
    at = f" at {where}" if where else ""
    if connection_failure(exc) is not None:
        advice = CONNECTION_ADVICE.format(where=where or "the address")
    else:
        advice = "check that the service is reachable and retry later"
    return f"{what}: still failing after {attempts} attempts{at}: {why}; {advice}"


def secret_values(model: Any) -> list[str]:
    """The values of a pydantic model's secret fields (those excluded from dumps), nested models included."""
    from pydantic import BaseModel

    found: list[str] = []
    if not isinstance(model, BaseModel):
        return found
    for name, field in type(model).model_fields.items():
        value = getattr(model, name, None)
        if isinstance(value, BaseModel):
            found.extend(secret_values(value))
        elif field.exclude and isinstance(value, str) and value:
            found.append(value)
    return found
