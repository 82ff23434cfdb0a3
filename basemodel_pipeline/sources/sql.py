"""The one query every backend runs, built as a sqlglot tree and rendered per dialect.

Identifiers are always quoted. User SQL (where_condition, sql_lambdas) is parsed in the source's dialect,
checked to be one expression with no subquery, its column references bound to the source table, and
re-rendered: it is never pasted into the query text.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.tokens import TokenType

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


MAX_SQL_NESTING = 16  # parentheses, CASE and prefix operators inside each other in one user expression
OPENS = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE}
CLOSES = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END}
PREFIX = {TokenType.NOT, TokenType.DASH, TokenType.PLUS}


class SqlError(ValueError):
    """User SQL that cannot be used: `detail` says why, `col` where in the text (None when unknown); `parsed`:
    it parsed, but is not one expression (a statement, several, a subquery)."""

    def __init__(self, detail: str, col: int | None = None, parsed: bool = False) -> None:
        super().__init__(detail)
        self.detail, self.col, self.parsed = detail, col, parsed


def shown_sql(text: str, limit: int = 80) -> str:
    """User SQL for a one-line message: quoted, cut to `limit` characters."""
    return repr(text) if len(text) <= limit else f"{text[: limit - 3]!r}... ({len(text):,} characters)"


def _nesting(tokens: list) -> int:
    """How deeply the tokens nest (parentheses, brackets, CASE ... END, runs of NOT / unary signs)."""
    depth = deepest = run = 0
    for token in tokens:
        kind = token.token_type
        run = run + 1 if kind in PREFIX else 0
        depth += (kind in OPENS) - (kind in CLOSES)
        deepest = max(deepest, depth + run)
    return deepest


def parse_expression(text: str, dialect: str) -> exp.Expression:
    """One user SQL expression parsed in `dialect`. SqlError when it does not parse, nests more than
    MAX_SQL_NESTING levels (sqlglot parses recursively: about 40 nested parentheses exhaust Python's stack),
    or is not a single expression (a statement, several, a subquery). Its length is bounded by the config
    (MAX_STRING_CHARS), so parsing takes a fraction of a second at most."""
    try:
        tokens = Dialect.get_or_raise(dialect).tokenize(text)
        if _nesting(tokens) > MAX_SQL_NESTING:
            raise SqlError(f"it is nested more than {MAX_SQL_NESTING} levels deep; simplify it")
        statements = sqlglot.parse(text, read=dialect)
    except sqlglot.errors.ParseError as err:
        first = err.errors[0] if err.errors else {}
        raise SqlError(first.get("description") or one_line(err), first.get("col")) from None
    except sqlglot.errors.SqlglotError as err:  # TokenError: an unterminated string, quote or comment
        raise SqlError(one_line(err)) from None
    except RecursionError:
        raise SqlError(f"it is nested too deeply (at most {MAX_SQL_NESTING} levels); simplify it") from None
    node = statements[0] if len(statements) == 1 else None
    if node is None or isinstance(node, exp.Query | exp.Command | exp.DDL | exp.DML) or node.find(exp.Query):
        raise SqlError("not one expression (a statement, several, or a subquery)", parsed=True)
    return node


def one_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def parse_fragment(
    src: DataSource, text: str, dialect: str, what: str, table: str | None = SOURCE_ALIAS
) -> exp.Expression:
    """Parse one user SQL expression; unqualified columns are bound to `table` (left unqualified when None).
    ConfigError when invalid."""
    try:
        node = parse_expression(text, dialect)
    except SqlError as err:
        if err.parsed:
            raise ConfigError(
                f"data source '{src.name}': {what} {shown_sql(text)} must be one SQL expression on the source's "
                "columns (no statements or subqueries)"
            ) from None
        raise ConfigError(
            f"data source '{src.name}': {what} {shown_sql(text)} is not valid {dialect} SQL: {err.detail}"
        ) from None
    node = normalize_identifiers(
        node.copy(), dialect=dialect
    )  # unquoted names follow the dialect's case rule
    if table is not None:
        for col in node.find_all(exp.Column):
            if not col.table:
                col.set("table", exp.to_identifier(table, quoted=True))
    return node


def table_from_name(name: str, dialect: str) -> exp.Table:
    """A configured table_name ('db.schema.events', quoted parts kept exact) as a table expression."""
    try:
        table = exp.to_table(name, dialect=dialect)
    except sqlglot.errors.ParseError as err:
        raise ConfigError(f"table_name {name!r} is not a valid {dialect} table name: {err}") from None
    return normalize_identifiers(table, dialect=dialect)


def timestamp_expr(
    src: DataSource, dtype: str, dialect: str, table: str = SOURCE_ALIAS, column_name: str | None = None
) -> exp.Expression:
    """The date column as a TIMESTAMP in `dialect` (text dates parsed with date_column.format)."""
    assert src.date_column is not None
    col = column(column_name or src.date_column.name, table)
    fmt = src.date_column.format
    if not fmt:
        if dtype.upper().startswith(TEXT_TYPES):
            raise ConfigError(
                f"data source '{src.name}': date_column '{src.date_column.name}' is text; set "
                "date_column.format (strptime syntax, e.g. '%Y-%m-%d %H:%M:%S')"
            )
        return exp.cast(col, timestamp_type(dialect))
    text = exp.cast(col, exp.DataType.Type.TEXT)
    if dialect == "clickhouse":
        ch = fmt
        for py, mysql in CLICKHOUSE_FORMAT.items():
            ch = ch.replace(py, mysql)
        parsed = exp.Anonymous(this="parseDateTime", expressions=[text, exp.Literal.string(ch)])
        return exp.cast(parsed, timestamp_type(dialect))
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


def timestamp_type(dialect: str) -> exp.DataType:
    """TIMESTAMP; in ClickHouse DateTime64(6), which reaches Arrow as a timestamp (DateTime is a uint32)."""
    if dialect == "clickhouse":
        return exp.DataType.build("DateTime64(6)", dialect="clickhouse")
    return exp.DataType.build("TIMESTAMP")


def day_literal(day: dt.date, dialect: str) -> exp.Expression:
    return exp.cast(exp.Literal.string(day.isoformat()), timestamp_type(dialect))


@dataclass(frozen=True)
class Join:
    """An attribute source joined to an event source: its table expression and the columns it adds."""

    src: DataSource
    table: exp.Expression
    on: dict[str, str]
    columns: list[str]


def resolve(name: str, available: dict[str, str]) -> str | None:
    """The source column a configured name means: exact, else the one case-insensitive match
    (Snowflake reports unquoted names in upper case, Hive and Databricks in lower case)."""
    if name in available:
        return name
    matches = [c for c in available if c.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def selected_columns(src: DataSource, available: dict[str, str], location: str) -> dict[str, str]:
    """Output name -> source column of the columns kept: keys plus allowed (or all minus disallowed),
    minus `ignore` overrides. Configured names keep the config's spelling in the output."""
    from basemodel_pipeline.errors import DataError

    keys = src.key_columns()
    if src.allowed_columns is not None:
        wanted = list(dict.fromkeys([*keys, *src.allowed_columns]))
    else:
        banned = {c.lower() for c in src.disallowed_columns or []}
        key_of = {c.lower(): c for c in keys}
        wanted = [
            key_of.get(c.lower(), c) for c in available if c.lower() not in banned or c.lower() in key_of
        ]
    resolved = {c: resolve(c, available) for c in wanted}
    missing = [c for c, actual in resolved.items() if actual is None]
    if missing:
        raise DataError(
            f"source '{src.name}' ({location}): column(s) {', '.join(missing)} not found; "
            f"available: {', '.join(available)}"
        )
    lambdas = {lam.alias for lam in src.sql_lambdas}
    return {
        out: actual
        for out, actual in resolved.items()
        if actual is not None
        and (src.column_types.get(out) != "ignore" or out in keys)
        and out not in lambdas
    }


def source_query(
    src: DataSource, table: exp.Expression, available: dict[str, str], dialect: str, **options: Any
) -> str:
    """SELECT of a source's rows in `dialect` (source_select's options)."""
    return source_select(src, table, available, dialect, **options).sql(dialect=dialect, identify=True)


def source_select(
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
) -> exp.Select:
    """SELECT of a source's rows: selected columns, sql_lambdas, the date column as TIMESTAMP,
    where_condition, events in [start, ...) and in the `days` range, LEFT JOINed attribute columns."""
    names = selected_columns(src, available, location)
    ts = None
    if src.date_column is not None:
        actual = names[src.date_column.name]
        ts = timestamp_expr(src, available[actual], dialect, column_name=actual)
    items: list[exp.Expression] = []
    for name, actual in names.items():
        expr = ts if ts is not None and src.date_column and name == src.date_column.name else column(actual)
        items.append(exp.alias_(expr, name, quoted=True))
    for lam in src.sql_lambdas:
        items.append(
            exp.alias_(parse_fragment(src, lam.expression, dialect, "sql_lambda"), lam.alias, quoted=True)
        )
    query = exp.select(*items).from_(exp.alias_(table, SOURCE_ALIAS, table=True))
    for j, join in enumerate(joins):
        alias = f"j{j}"
        on = exp.and_(
            *(exp.EQ(this=column(names[a]), expression=column(b, alias)) for a, b in join.on.items())
        )
        query = query.join(exp.alias_(join.table, alias, table=True), on=on, join_type="left")
        query = query.select(
            *(exp.alias_(column(c, alias), c, quoted=True) for c in join.columns), copy=False
        )
    conditions: list[exp.Expression] = []
    if src.where_condition:
        conditions.append(exp.paren(parse_fragment(src, src.where_condition, dialect, "where_condition")))
    if ts is not None and start is not None:
        conditions.append(exp.GTE(this=ts.copy(), expression=day_literal(start, dialect)))
    if ts is not None and days is not None:
        conditions.append(exp.GTE(this=ts.copy(), expression=day_literal(days[0], dialect)))
        conditions.append(exp.LT(this=ts.copy(), expression=day_literal(days[1], dialect)))
    if conditions:
        query = query.where(exp.and_(*conditions))
    if limit is not None:
        query = query.limit(limit)
    return query


def timestamp_query(
    src: DataSource,
    table: exp.Expression,
    available: dict[str, str],
    dialect: str,
    *,
    latest: bool = True,
    days: tuple[dt.date | None, dt.date | None] = (None, None),
) -> str:
    """SELECT MAX (or MIN) of the date column as TIMESTAMP FROM the source, over the events in [days[0],
    days[1]) (either end open when None). Without `days`, answered from Parquet statistics or min-max
    indexes when the column is a DATE/TIMESTAMP (no cast per row)."""
    assert src.date_column is not None
    actual = resolve(src.date_column.name, available)
    if actual is None:
        from basemodel_pipeline.errors import DataError

        raise DataError(
            f"source '{src.name}': date column '{src.date_column.name}' not found; available: {', '.join(available)}"
        )
    agg = exp.Max if latest else exp.Min
    raw = not src.date_column.format and available[actual].upper().startswith(("TIMESTAMP", "DATE"))
    ts = column(actual) if raw else timestamp_expr(src, available[actual], dialect, column_name=actual)
    value = exp.cast(agg(this=ts), timestamp_type(dialect)) if raw else agg(this=ts)
    query = exp.select(exp.alias_(value, "watermark", quoted=True))
    query = query.from_(exp.alias_(table, SOURCE_ALIAS, table=True))
    conditions = [exp.GTE(this=ts.copy(), expression=day_literal(days[0], dialect))] if days[0] else []
    if days[1] is not None:
        conditions.append(exp.LT(this=ts.copy(), expression=day_literal(days[1], dialect)))
    if conditions:
        query = query.where(exp.and_(*conditions))
    return query.sql(dialect=dialect, identify=True)


def count_from_query(src: DataSource, rows: exp.Select, day: dt.date, dialect: str) -> str:
    """SELECT count, first and last timestamp of the rows of `rows` (a source_select) from `day` on."""
    assert src.date_column is not None
    ts = column(src.date_column.name, "q")
    query = exp.select(exp.Count(this=exp.Star()), exp.Min(this=ts), exp.Max(this=ts.copy()))
    query = query.from_(rows.subquery("q")).where(
        exp.GTE(this=ts.copy(), expression=day_literal(day, dialect))
    )
    return query.sql(dialect=dialect, identify=True)


def schema_query(table: exp.Expression, dialect: str) -> str:
    """SELECT * FROM the source with no rows: its column names and types."""
    query = exp.select(exp.Star()).from_(exp.alias_(table, SOURCE_ALIAS, table=True))
    return query.where(exp.false()).sql(dialect=dialect, identify=True)
