"""Dates and times as the pipeline stores them: event times are Unix seconds (UTC), days whole multiples of DAY.

Ground floor (docs/architecture.md): every layer may import this module; it imports nothing of the pipeline.
"""

from __future__ import annotations

import datetime as dt

DAY = 86400  # seconds
# The days the pipeline handles: config dates and event days lie in [FIRST_DAY, END_DAY). Nanosecond timestamps
# (numpy datetime64[ns], pandas, Arrow's ns unit) end on 2262-04-11 at 23:47:16, so that day is left out whole.
FIRST_DAY = dt.date(1900, 1, 1)
END_DAY = dt.date(2262, 4, 11)


def epoch_seconds(day: dt.date) -> int:
    """Midnight UTC of `day`, in Unix seconds."""
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp())


def iso_day(ts: int | None) -> str | None:
    """The UTC day of Unix seconds `ts` as YYYY-MM-DD (None stays None)."""
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).date().isoformat()
