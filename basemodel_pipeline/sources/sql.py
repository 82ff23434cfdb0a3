"""The one query every backend runs, built as a sqlglot tree and rendered per dialect.

Identifiers are always quoted. User SQL (where_condition, sql_lambdas) is parsed in the source's dialect,
checked to be one expression with no subquery, its column references bound to the source table, and
re-rendered: it is never pasted into the query text.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import ConfigError

SOURCE_ALIAS = "t"
TEXT_TYPES = ("VARCHAR", "TEXT", "STRING")
# python strftime -> ClickHouse parseDateTime (MySQL syntax) where they differ
CLICKHOUSE_FORMAT = {"%M": "%i", "%S": "%s"}
ISO_FORMATS = ("%Y-%m-%d", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")


def quote_ident(name: str) -> str:
    """A DuckDB identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A SQL string literal, quoted."""
    return "'" + value.replace("'", "''") + "'"


def column(name: str, table: str | None = SOURCE_ALIAS) -> exp.Column:
    return exp.column(name, table=table, quoted=True)


def parse_fragment(
    src: DataSource, text: str, dialect: str, what: str, table: str = SOURCE_ALIAS
) -> exp.Expression:
    """Parse one user SQL expression; unqualified columns are bound to `table`. ConfigError when invalid."""
    try:
        statements = sqlglot.parse(text, read=dialect)
    except sqlglot.errors.ParseError as err:
        first = err.errors[0] if err.errors else {}
        detail = first.get("description") or str(err).splitlines()[0]
        raise ConfigError(
            f"data source '{src.name}': {what} {text!r} is not valid {dialect} SQL: {detail}"
        ) from None
    node = statements[0] if len(statements) == 1 else None
    if node is None or isinstance(node, exp.Query | exp.Command | exp.DDL | exp.DML) or node.find(exp.Query):
        raise ConfigError(
            f"data source '{src.name}': {what} {text!r} must be one SQL expression on the source's "
            "columns (no statements or subqueries)"
        )
    node = node.copy()
    for col in node.find_all(exp.Column):
        if not col.table:
            col.set("table", exp.to_identifier(table))
        col.this.set("quoted", True)
    return node


def timestamp_expr(src: DataSource, dtype: str, dialect: str, table: str = SOURCE_ALIAS) -> exp.Expression:
    """The date column as a TIMESTAMP in `dialect` (text dates parsed with date_column.format)."""
    assert src.date_column is not None
    col = column(src.date_column.name, table)
    fmt = src.date_column.format
    if not fmt:
        if dtype.upper().startswith(TEXT_TYPES):
            raise ConfigError(
                f"data source '{src.name}': date_column '{src.date_column.name}' is text; set "
                "date_column.format (strptime syntax, e.g. '%Y-%m-%d %H:%M:%S')"
            )
        return exp.cast(col, exp.DataType.Type.TIMESTAMP)
    text = exp.cast(col, exp.DataType.Type.TEXT)
    if dialect == "clickhouse":
        ch = fmt
        for py, mysql in CLICKHOUSE_FORMAT.items():
            ch = ch.replace(py, mysql)
        return exp.Anonymous(this="parseDateTime", expressions=[text, exp.Literal.string(ch)])
    if dialect == "tsql":
        if fmt not in ISO_FORMATS:
            raise ConfigError(
                f"data source '{src.name}': date_column.format {fmt!r} cannot be parsed in T-SQL; store the "
                f"column as DATETIME2 or use one of {', '.join(ISO_FORMATS)}"
            )
        return exp.cast(text, exp.DataType.Type.TIMESTAMP)
    if dialect == "hive":
        unix = exp.StrToUnix(this=text, format=exp.Literal.string(fmt))
        return exp.cast(exp.UnixToTime(this=unix), exp.DataType.Type.TIMESTAMP)
    return exp.StrToTime(this=text, format=exp.Literal.string(fmt))


def day_literal(day: dt.date) -> exp.Expression:
    return exp.cast(exp.Literal.string(day.isoformat()), exp.DataType.Type.TIMESTAMP)


@dataclass(frozen=True)
class Join:
    """An attribute source joined to an event source: its table expression and the columns it adds."""

    src: DataSource
    table: exp.Expression
    on: dict[str, str]
    columns: list[str]


def selected_columns(src: DataSource, available: dict[str, str], location: str) -> list[str]:
    """Columns kept from a source: keys plus allowed (or all minus disallowed), minus `ignore` overrides."""
    from basemodel_pipeline.errors import DataError

    keys = src.key_columns()
    if src.allowed_columns is not None:
        wanted = list(dict.fromkeys([*keys, *src.allowed_columns]))
    else:
        banned = set(src.disallowed_columns or [])
        wanted = [c for c in available if c not in banned or c in keys]
    missing = [c for c in wanted if c not in available]
    if missing:
        raise DataError(
            f"source '{src.name}' ({location}): column(s) {', '.join(missing)} not found; "
            f"available: {', '.join(available)}"
        )
    lambdas = {lam.alias for lam in src.sql_lambdas}
    return [c for c in wanted if (src.column_types.get(c) != "ignore" or c in keys) and c not in lambdas]


def source_query(
    src: DataSource,
    table: exp.Expression,
    available: dict[str, str],
    dialect: str,
    *,
    location: str,
    start: dt.date | None = None,
    days: tuple[dt.date, dt.date] | None = None,
    joins: list[Join] = (),  # type: ignore[assignment]
    limit: int | None = None,
) -> str:
    """SELECT of a source's rows in `dialect`: selected columns, sql_lambdas, the date column as TIMESTAMP,
    where_condition, events in [start, ...) and in the `days` range, LEFT JOINed attribute columns."""
    names = selected_columns(src, available, location)
    ts = timestamp_expr(src, available[src.date_column.name], dialect) if src.date_column else None
    items: list[exp.Expression] = []
    for name in names:
        expr = ts if ts is not None and src.date_column and name == src.date_column.name else column(name)
        items.append(exp.alias_(expr, name, quoted=True))
    for lam in src.sql_lambdas:
        items.append(
            exp.alias_(parse_fragment(src, lam.expression, dialect, "sql_lambda"), lam.alias, quoted=True)
        )
    query = exp.select(*items).from_(exp.alias_(table, SOURCE_ALIAS, table=True))
    for j, join in enumerate(joins):
        alias = f"j{j}"
        on = exp.and_(*(exp.EQ(this=column(a), expression=column(b, alias)) for a, b in join.on.items()))
        query = query.join(exp.alias_(join.table, alias, table=True), on=on, join_type="left")
        query = query.select(
            *(exp.alias_(column(c, alias), c, quoted=True) for c in join.columns), copy=False
        )
    conditions: list[exp.Expression] = []
    if src.where_condition:
        conditions.append(exp.paren(parse_fragment(src, src.where_condition, dialect, "where_condition")))
    if ts is not None and start is not None:
        conditions.append(exp.GTE(this=ts.copy(), expression=day_literal(start)))
    if ts is not None and days is not None:
        conditions.append(exp.GTE(this=ts.copy(), expression=day_literal(days[0])))
        conditions.append(exp.LT(this=ts.copy(), expression=day_literal(days[1])))
    if conditions:
        query = query.where(exp.and_(*conditions))
    if limit is not None:
        query = query.limit(limit)
    return query.sql(dialect=dialect, identify=True)


def max_timestamp_query(src: DataSource, table: exp.Expression, dtype: str, dialect: str) -> str:
    """SELECT MAX(<date column as TIMESTAMP>) FROM the source."""
    ts = timestamp_expr(src, dtype, dialect)
    query = exp.select(exp.alias_(exp.Max(this=ts), "watermark", quoted=True))
    return query.from_(exp.alias_(table, SOURCE_ALIAS, table=True)).sql(dialect=dialect, identify=True)


def schema_query(table: exp.Expression, dialect: str) -> str:
    """SELECT * FROM the source with no rows: its column names and types."""
    query = exp.select(exp.Star()).from_(exp.alias_(table, SOURCE_ALIAS, table=True))
    return query.where(exp.false()).sql(dialect=dialect, identify=True)
