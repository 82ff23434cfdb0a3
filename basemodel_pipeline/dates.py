"""Dates and times as the pipeline stores them: event times are Unix seconds (UTC), days whole multiples of DAY.

Ground floor (docs/architecture.md): every layer may import this module; it imports nothing of the pipeline.
"""

from __future__ import annotations

import datetime as dt

DAY = 86400  # seconds


def epoch_seconds(day: dt.date) -> int:
    """Midnight UTC of `day`, in Unix seconds."""
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp())


def iso_day(ts: int | None) -> str | None:
    """The UTC day of Unix seconds `ts` as YYYY-MM-DD (None stays None)."""
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).date().isoformat()
