"""The data checks across sources and scenarios: joins and entity ids match between sources, scenario targets
name usable columns, and every scenario's test window ends inside the data.

CrossChecks is mixed into the checker of sources/data_checks.py, which runs these after the checks of each
source (sources/column_checks.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.sources import day_bound
from basemodel_pipeline.sources.check_context import CheckContext
from basemodel_pipeline.sources.parquet import is_local, quote_ident
from basemodel_pipeline.sources.sql import resolve


def _text(alias: str, column: str) -> str:
    return f"CAST({alias}.{quote_ident(column)} AS VARCHAR)"


class CrossChecks(CheckContext):
    """Checks that relate sources to each other and scenarios to their sources."""

    def check_join(self, where: str, left: DataSource, right_name: str, keys: dict[str, str]) -> None:
        right = self.cfg.source(right_name)
        # compare as text: IDs stored as 1001 in one source and '1001' in the other still match
        on = " AND ".join(f"{_text('l', a)} = {_text('r', b)}" for a, b in keys.items())
        matches = f"SELECT 1 FROM {self.keys_rel(right, list(keys.values()))} r WHERE {on}"
        sql = f"SELECT 1 FROM {self.rel(left)} l WHERE EXISTS ({matches}) LIMIT 1"
        if self.con.execute(sql).fetchone() is not None:
            return
        self.fail(
            where,
            f"no row of '{left.name}' matches a row of '{right.name}' on {self.describe_keys(keys)}; "
            f"e.g. {left.name} has {self.examples(left, list(keys))} but {right.name} has "
            f"{self.examples(right, list(keys.values()))}. Make the IDs use the same format in both sources.",
        )

    @staticmethod
    def describe_keys(keys: dict[str, str]) -> str:
        return ", ".join(f"{a} = {b}" for a, b in keys.items())

    def examples(self, src: DataSource, cols: list[str]) -> str:
        select = ", ".join(quote_ident(c) for c in cols)
        sample = f"SELECT {select} FROM {self.rel(src)} LIMIT 1000"
        rows = self.con.execute(f"SELECT DISTINCT * FROM ({sample}) LIMIT 3").fetchall()
        return ", ".join(repr(r[0]) if len(r) == 1 else repr(r) for r in rows) or "no rows"

    def check_entity_ids(self) -> None:
        """Entity ids are compared by value across sources: integers when every entity column is an integer,
        else text, an integer written as plain decimal text ('42'). When the types differ, every id of a
        non-integer column must be such plain integer text: '000042', '42.0' or 'H42' would match by
        accident of a cast, or not at all, and silently split or lose entities."""
        from basemodel_pipeline.sources.types import INTEGER_PREFIXES

        typed = []
        for i, src in enumerate(self.cfg.data_sources):
            if src.type in ("event", "main_entity_attribute") and src.main_entity_column:
                name = resolve(src.main_entity_column, self.columns[src.name]) or src.main_entity_column
                typed.append((i, src, name, self.columns[src.name].get(name, "")))
        integers = [t for t in typed if t[3].upper().startswith(INTEGER_PREFIXES)]
        if not integers or len(integers) == len(typed):
            return
        _, isrc, icol, itype = integers[0]
        for i, src, col, dtype in typed:
            if dtype.upper().startswith(INTEGER_PREFIXES):
                continue
            text = f"CAST({quote_ident(col)} AS VARCHAR)"
            plain = f"regexp_full_match({text}, '-?(0|[1-9][0-9]{{0,17}})')"
            n, example = self.con.execute(
                f"SELECT count(*), any_value({text}) FROM {self.rel(src)} "
                f"WHERE {quote_ident(col)} IS NOT NULL AND NOT {plain}"
            ).fetchone() or (0, None)
            if n:
                self.fail(
                    f"data_sources[{i}].main_entity_column",
                    f"entity ids differ in type: '{isrc.name}'.{icol} is {itype} but '{src.name}'.{col} is "
                    f"{dtype}, and {n} of its ids are not plain integers (e.g. {example!r}), so they cannot "
                    f"be matched with '{isrc.name}' by value; write the ids the same way in both sources "
                    "(integers everywhere, or the same text everywhere)",
                )

    def column_type(self, src: DataSource, column: str) -> str:
        """The data type of an event source's own or joined column ('' when unknown)."""
        for name in (src.name, *(j.name for j in src.joined_data_sources)):
            types = self.columns.get(name, {})
            found = resolve(column, types) if types else None
            if found is not None:
                return types[found]
        return ""

    def check_list_use(self, where: str, sc: Any, src: DataSource, field: str, column: str) -> None:
        """A list-valued column (a movie's genres) can be a multilabel target or a feature, nothing else."""
        from basemodel_pipeline.sources.types import is_list_type

        if not is_list_type(self.column_type(src, column)):
            return
        if sc.target.kind == "multilabel" and field == "column":  # a list column labels a multilabel target
            return
        use = "a filter" if field.startswith("filter") else f"the column of a {sc.task} target"
        self.fail(
            where,
            f"column '{column}' of data source '{src.name}' holds lists of values; it can be a multilabel "
            f"target (one label per value) or a feature, not {use}. Use a column with one value per event",
        )

    def last_day(self, src: DataSource) -> dt.date | None:
        """The last event day of a local event source before day_bound, as the extract sees it (events
        stamped 2100 or 9999 are left out), None elsewhere: warehouses are not scanned here."""
        if not is_local(src) or src.date_column is None:
            return None
        name = resolve(src.date_column.name, self.columns[src.name]) or src.date_column.name
        col = quote_ident(name)
        fmt = src.date_column.format
        expr = f"try_strptime({col}, ?)" if fmt else col
        params = [fmt, fmt] if fmt else []
        value = self.con.execute(
            f"SELECT max({expr}) FILTER (WHERE {expr} < CAST(? AS TIMESTAMP)) FROM {self.rel(src)}",
            [*params, day_bound(self.cfg).isoformat()],
        ).fetchone()
        if value is None or value[0] is None:
            return None
        v = value[0]
        return v.date() if isinstance(v, dt.datetime) else v

    def check_test_windows(self) -> None:
        """Every scenario's test window [training_end_date, + horizon) must end inside the data: otherwise
        fine-tuning fails after a whole pretraining, on an empty or one-class test window. Rolling windows are
        resolved against the newest event day of the sources, as a run would against the cache."""
        dp = raw = self.cfg.data_params
        resolved_at = None
        if dp.rolling:
            events = [s for s in self.cfg.data_sources if s.type == "event"]
            days = [d for s in events if (d := self.last_day(s)) is not None]
            if not days:
                return
            resolved_at = max(days)
            try:
                dp = dp.resolved(resolved_at, self.cfg.longest_horizon_days)
            except ConfigError as err:
                where, _, message = str(err).partition(": ")
                self.fail(where if where.startswith("data_params") else "data_params", message)
        self.check_windows_fit(raw, dp, resolved_at)
        test = dp.test_date
        for i, sc in enumerate(self.cfg.scenarios):
            last = self.last_day(self.cfg.source(sc.target.source))
            if last is None:
                continue
            end = test + dt.timedelta(days=sc.target.horizon_days)
            if end > last + dt.timedelta(days=1):
                latest = last + dt.timedelta(days=1) - dt.timedelta(days=sc.target.horizon_days)
                self.fail(
                    "data_params.training_end_date",
                    f"scenario '{sc.name}' (scenarios[{i}]) is tested on [{test}, {end}), but data source "
                    f"'{sc.target.source}' ends on {last}; set training_end_date to {latest} or earlier. "
                    "Scoring as of the end of the data does not need it: `basemodel predict` scores as of the "
                    "day after the last event",
                )

    def check_windows_fit(self, raw: Any, dp: Any, resolved_at: dt.date | None) -> None:
        """Every scenario's horizon fits a training window (training_start_date .. validation_start_date) and a
        validation window (validation_start_date .. training_end_date), as fine-tuning needs; otherwise it
        would fail after a whole pretraining. Names the dates and the latest start that works (for a relative
        start, the smallest offset in its own unit)."""
        against = (
            f" (rolling windows resolved against the last event day {resolved_at})" if resolved_at else ""
        )
        for i, sc in enumerate(self.cfg.scenarios):
            horizon = dt.timedelta(days=sc.target.horizon_days)
            spans = [
                ("validation_start_date", dp.validation_start, "training_end_date", dp.test_date),
                ("training_start_date", dp.first_split, "validation_start_date", dp.validation_start),
            ]
            for start_name, start, end_name, end in spans:
                if start + horizon <= end:
                    continue
                given = getattr(raw, start_name)
                latest = end - horizon
                works = (
                    _offset(raw, given, (dp.test_date - latest).days) if isinstance(given, str) else latest
                )
                self.fail(
                    f"data_params.{start_name}",
                    f"scenario '{sc.name}' (scenarios[{i}]): a {sc.target.horizon_days}-day target window does "
                    f"not fit between {start_name} ({start}) and {end_name} ({end}){against}; set {start_name} "
                    f"to {works} or earlier, or shorten the horizon",
                )


def _offset(dp: Any, given: str, days: int) -> str:
    """The smallest relative date in the unit of `given` ("-8w", "-56d", "-8splits") that reaches back `days`."""
    unit = "splits" if given.endswith("splits") else given[-1]
    size = {"d": 1, "w": 7, "splits": dp.split_interval_days}[unit]
    return f"-{-(-days // size)}{unit}"
