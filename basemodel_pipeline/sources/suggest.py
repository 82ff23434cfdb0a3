"""`basemodel suggest-config`: inspect the sources of a config and write a suggested config.

For every source a sample of rows is profiled in DuckDB: column types are inferred (categorical / numeric /
ignore), and columns are flagged as constant, ID-like (unique per row, or a bijection with the main entity
column: another id of the same entity), leakage-like (named like a label, or a second timestamp that may
record the future), and, in main-entity attribute tables, time-series candidates (several rows per entity,
or snapshot values such as balances and dates that change over time). Join keys are compared between the
sample of the joining source and all keys of the joined one: keys that never or rarely match (IDs formatted
differently, e.g. "C-123" vs 123) are an error that shows examples of both sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import yaml

from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources import sample_rows
from basemodel_pipeline.sources.sql import quote_ident, resolve
from basemodel_pipeline.sources.types import FLOAT_PREFIXES, NUMERIC_PREFIXES

SAMPLE_ROWS = 200_000
KEY_ROWS = 10_000_000
RARE_MATCH = 0.5  # below this share of sampled join keys found on the other side, a join is an error
LOW_CARDINALITY_INT = 2  # integer columns with at most this many values are flags: categorical
LEAKAGE_NAME = re.compile(
    r"(^|_)(label|target|churn|churned|outcome|converted|fraud|is_fraud|response|y)($|_)", re.I
)
SNAPSHOT_NAME = re.compile(r"^(last|total|num|count|avg|balance|days_since|lifetime|current)(_|$)", re.I)
TIME_TYPES = ("DATE", "TIME", "TIMESTAMP")


@dataclass
class ColumnProfile:
    name: str
    dtype: str
    rows: int
    non_null: int
    distinct: int
    suggested: str = "categorical"
    flags: list[str] = field(default_factory=list)


@dataclass
class SourceProfile:
    src: DataSource
    rows: int
    columns: list[ColumnProfile]
    notes: list[str] = field(default_factory=list)

    def flagged(self) -> list[ColumnProfile]:
        return [c for c in self.columns if c.suggested == "ignore"]


def _type_of(name: str, dtype: str, distinct: int) -> str:
    t = dtype.upper()
    if t.endswith("[]") or t.startswith("LIST"):
        return "list"  # inferred by the cache (multi-hot), not written into column_types
    if t.startswith(TIME_TYPES) or t.startswith(("BLOB", "STRUCT", "MAP")):
        return "ignore"
    if t.startswith(FLOAT_PREFIXES):
        return "numeric"
    if t.startswith(NUMERIC_PREFIXES):
        id_name = name.lower().endswith(("id", "_key", "_code"))
        return "categorical" if id_name or distinct <= LOW_CARDINALITY_INT else "numeric"
    return "categorical"


def key_columns(cfg: PipelineConfig, src: DataSource) -> list[str]:
    """The source's own keys plus the columns other sources join on (an attribute table's id)."""
    joined = [
        b
        for other in cfg.data_sources
        for j in other.joined_data_sources
        if j.name == src.name
        for b in j.join_on.values()
    ]
    return [*src.key_columns(), *joined]


def wanted(src: DataSource, name: str) -> bool:
    if src.allowed_columns is not None:
        return name.lower() in {c.lower() for c in src.allowed_columns}
    return name.lower() not in {c.lower() for c in src.disallowed_columns or []}


def profile_source(cfg: PipelineConfig, src: DataSource, rows: int = SAMPLE_ROWS) -> SourceProfile:
    table = sample_rows(cfg, src, rows)
    con = duckdb.connect()
    try:
        con.register("sample", table)
        rel = con.sql("SELECT * FROM sample")
        types = {n: str(t) for n, t in zip(rel.columns, rel.types, strict=True)}
        keys = {resolve(k, types) for k in key_columns(cfg, src)}
        entity = resolve(src.main_entity_column, types) if src.main_entity_column else None
        n_entities = (
            con.execute(f"SELECT count(DISTINCT {quote_ident(entity)}) FROM sample").fetchone()[0]
            if entity
            else 0
        )
        profiles = []
        for name, dtype in types.items():
            if name in keys or not wanted(src, name):
                continue
            col = quote_ident(name)
            non_null, distinct = con.execute(
                f"SELECT count({col}), count(DISTINCT {col}) FROM sample"
            ).fetchone()
            prof = ColumnProfile(
                name, dtype, table.num_rows, non_null, distinct, _type_of(name, dtype, distinct)
            )
            _flag(con, src, prof, entity, n_entities)
            profiles.append(prof)
        profile = SourceProfile(src, table.num_rows, profiles)
        if src.type == "main_entity_attribute" and entity:
            per_entity = con.execute(
                f"SELECT max(n) FROM (SELECT count(*) AS n FROM sample GROUP BY {quote_ident(entity)})"
            ).fetchone()[0]
            if per_entity and per_entity > 1:
                profile.notes.append(
                    f"up to {per_entity} rows per {entity}: this is a time series, not one row of attributes per "
                    "entity; make it an event source with a date column"
                )
        return profile
    finally:
        con.close()


def _flag(
    con: duckdb.DuckDBPyConnection, src: DataSource, prof: ColumnProfile, entity: str | None, n_entities: int
) -> None:
    col = quote_ident(prof.name)
    if prof.distinct <= 1:
        prof.flags.append("constant" if prof.non_null else "always empty")
    elif prof.non_null > 50 and prof.distinct == prof.non_null:
        prof.flags.append("ID-like: unique in every row")
    elif entity and prof.distinct > 1 and prof.distinct == n_entities:
        pairs = con.execute(
            f"SELECT count(*) FROM (SELECT DISTINCT {quote_ident(entity)}, {col} FROM sample)"
        ).fetchone()[0]
        if pairs == n_entities:
            prof.flags.append(f"ID-like: one-to-one with {entity} (another id of the same entity)")
    if LEAKAGE_NAME.search(prof.name):
        prof.flags.append("leakage-like: named like a label or outcome")
    if src.type == "event" and prof.dtype.upper().startswith(TIME_TYPES):
        prof.flags.append("leakage-like: a second timestamp may record the future (delivery, cancellation)")
    if src.type == "main_entity_attribute" and (
        prof.dtype.upper().startswith(TIME_TYPES) or SNAPSHOT_NAME.match(prof.name)
    ):
        prof.flags.append(
            "time-series candidate: a snapshot value that changes over time; prefer its history as events"
        )
    if prof.suggested == "list":
        if src.type == "main_entity_attribute":
            prof.flags.append(
                "list-valued main-entity attribute: not used by the cache; store one row per value in an event "
                "or attribute source"
            )
            prof.suggested = "ignore"
        else:
            prof.flags.append(
                "list-valued: becomes 0/1 indicators of its 32 most frequent values (features); usable as a "
                "multilabel target"
            )
    if any(f.startswith(("constant", "always", "ID-like", "leakage")) for f in prof.flags):
        prof.suggested = "ignore"


@dataclass
class JoinCheck:
    where: str
    left: str
    right: str
    keys: dict[str, str]
    sampled: int
    matched: int
    left_examples: list[Any]
    right_examples: list[Any]

    @property
    def rate(self) -> float:
        return self.matched / self.sampled if self.sampled else 0.0

    def message(self) -> str:
        on = ", ".join(f"{a} = {b}" for a, b in self.keys.items())
        how = (
            "never match"
            if self.matched == 0
            else f"rarely match ({self.rate:.1%} of {self.sampled} sampled ids)"
        )
        return (
            f"{self.where}: join keys {on} of '{self.left}' and '{self.right}' {how}; e.g. {self.left} has "
            f"{', '.join(map(repr, self.left_examples))} but {self.right} has {', '.join(map(repr, self.right_examples))}. "
            "Make the IDs use the same format in both sources (e.g. a sql_lambda that strips a prefix)."
        )


def check_join(
    cfg: PipelineConfig, where: str, left: DataSource, right: DataSource, keys: dict[str, str]
) -> JoinCheck:
    """Share of the distinct key values in a sample of `left` that exist in `right` (compared as text)."""
    lcols, rcols = list(keys), list(keys.values())
    lt = sample_rows(cfg, left, SAMPLE_ROWS, columns=lcols).rename_columns(
        [f"k{i}" for i in range(len(lcols))]
    )
    rt = sample_rows(cfg, right, KEY_ROWS, columns=rcols).rename_columns([f"k{i}" for i in range(len(rcols))])
    con = duckdb.connect()
    try:
        con.register("l_raw", lt)
        con.register("r_raw", rt)
        text = ", ".join(f"CAST(k{i} AS VARCHAR) AS k{i}" for i in range(len(lcols)))
        con.execute(f"CREATE TEMP TABLE l AS SELECT DISTINCT {text} FROM l_raw WHERE k0 IS NOT NULL")
        con.execute(f"CREATE TEMP TABLE r AS SELECT DISTINCT {text} FROM r_raw WHERE k0 IS NOT NULL")
        on = " AND ".join(f"l.k{i} = r.k{i}" for i in range(len(lcols)))
        sampled = con.execute("SELECT count(*) FROM l").fetchone()[0]
        matched = con.execute(f"SELECT count(*) FROM l WHERE EXISTS (SELECT 1 FROM r WHERE {on})").fetchone()[
            0
        ]
        cols = ", ".join(f"k{i}" for i in range(len(lcols)))

        def examples(sql: str) -> list[Any]:
            return [r[0] if len(r) == 1 else r for r in con.execute(sql).fetchall()]

        unmatched = examples(
            f"SELECT {cols} FROM l WHERE NOT EXISTS (SELECT 1 FROM r WHERE {on}) ORDER BY ALL LIMIT 3"
        )
        right_examples = examples(f"SELECT {cols} FROM r ORDER BY ALL LIMIT 3")
    finally:
        con.close()
    return JoinCheck(where, left.name, right.name, keys, sampled, matched, unmatched, right_examples)


def join_checks(cfg: PipelineConfig) -> list[JoinCheck]:
    checks = []
    for i, src in enumerate(cfg.data_sources):
        for j, join in enumerate(src.joined_data_sources):
            where = f"data_sources[{i}].joined_data_sources[{j}].join_on"
            checks.append(check_join(cfg, where, src, cfg.source(join.name), dict(join.join_on)))
        if src.type == "main_entity_attribute" and src.main_entity_column:
            for ev in cfg.sources("event"):
                assert ev.main_entity_column
                keys = {ev.main_entity_column: src.main_entity_column}
                checks.append(check_join(cfg, f"data_sources[{i}].main_entity_column", ev, src, keys))
    return checks


def used_columns(cfg: PipelineConfig) -> dict[str, dict[str, str]]:
    """{source: {column: scenario}} of the columns scenario targets read, in their source or a joined one."""
    used: dict[str, dict[str, str]] = {}
    for sc in cfg.scenarios:
        src = cfg.source(sc.target.source)
        for _, col in sc.target.columns():
            for name in (src.name, *(j.name for j in src.joined_data_sources)):
                used.setdefault(name, {})[col] = sc.name
    return used


def keep_used(profile: SourceProfile, used: dict[str, str]) -> None:
    """A column a scenario reads is never dropped: the flag says why it would have been, and that it stays."""
    for c in profile.columns:
        if c.name in used and c.suggested == "ignore":
            c.flags.append(f"kept: scenario '{used[c.name]}' reads it")
            c.suggested = "categorical" if _type_of(c.name, c.dtype, c.distinct) != "numeric" else "numeric"
            if _type_of(c.name, c.dtype, c.distinct) == "list":
                c.suggested = "list"


def suggested_source(raw: dict[str, Any], profile: SourceProfile) -> dict[str, Any]:
    """The source's YAML mapping with column_types filled in and flagged columns left out."""
    out = dict(raw)
    ignored = [c.name for c in profile.flagged()]
    out["column_types"] = {
        **{c.name: c.suggested for c in profile.columns if c.suggested not in ("ignore", "list")},
        **raw.get("column_types", {}),
    }
    if raw.get("allowed_columns") is not None:
        out["allowed_columns"] = [c for c in raw["allowed_columns"] if c not in ignored]
    elif ignored:
        out["disallowed_columns"] = sorted({*raw.get("disallowed_columns", []), *ignored})
    return out


def suggest_config(
    cfg: PipelineConfig, config_file: Path, out: Path, rows: int = SAMPLE_ROWS
) -> dict[str, Any]:
    """Profile every source, check joins, write the suggested config (with the findings as comments)."""
    checks = join_checks(cfg)
    bad = [c for c in checks if c.rate < RARE_MATCH]
    if bad:
        raise DataError("; ".join(c.message() for c in bad))
    raw = yaml.safe_load(config_file.read_text())
    profiles = [profile_source(cfg, src, rows) for src in cfg.data_sources]
    used = used_columns(cfg)
    for p in profiles:
        keep_used(p, used.get(p.src.name, {}))
    raw["data_sources"] = [suggested_source(r, p) for r, p in zip(raw["data_sources"], profiles, strict=True)]
    lines = [
        f"# Suggested by `basemodel suggest-config {config_file.name}` from samples of up to {rows} rows per source."
    ]
    for p in profiles:
        lines.append(f"# {p.src.name} ({p.rows} rows sampled):")
        lines += [f"#   {c.name}: {'; '.join(c.flags)}" for c in p.columns if c.flags]
        lines += [f"#   note: {n}" for n in p.notes]
    lines += [f"# join {c.left} -> {c.right}: {c.rate:.1%} of {c.sampled} sampled ids match" for c in checks]
    text = "\n".join(lines) + "\n" + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return {
        "path": str(out),
        "flagged": {p.src.name: {c.name: c.flags for c in p.columns if c.flags} for p in profiles},
        "notes": {p.src.name: p.notes for p in profiles if p.notes},
        "joins": {f"{c.left}->{c.right}": round(c.rate, 4) for c in checks},
    }
