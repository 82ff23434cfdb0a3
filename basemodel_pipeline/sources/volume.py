"""Data-volume report: the measured size of the extracted event data against the reference product's
guidelines (at least 10k main entities, 100k events per month, 3 months of history for frequent
interactions and 1 year for infrequent ones). Read from the extracts with DuckDB: no source queries."""

from __future__ import annotations

from typing import Any

import duckdb

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.sources.sql import quote_ident, quote_literal

MIN_ENTITIES = 10_000
MIN_EVENTS_PER_MONTH = 100_000
MIN_MONTHS_FREQUENT = 3
MIN_MONTHS_INFREQUENT = 12
FREQUENT = 1.0  # median events per active entity per month at or above this: frequent interactions
DAYS_PER_MONTH = 365.25 / 12


def source_volume(cfg: PipelineConfig, src: DataSource) -> dict[str, Any]:
    files = sorted(ws.extracts_dir(cfg, src.name).glob("*.parquet"))
    if not files:
        raise UserError(f"no extract of source '{src.name}'; run `basemodel extract CONFIG` first")
    assert src.main_entity_column and src.date_column
    rel = f"read_parquet({quote_literal(str(ws.extracts_dir(cfg, src.name) / '*.parquet'))})"
    ent, ts = quote_ident(src.main_entity_column), quote_ident(src.date_column.name)
    con = duckdb.connect()
    try:
        events, entities, first, last = con.execute(
            f"SELECT count(*), count(DISTINCT {ent}), min({ts}), max({ts}) FROM {rel}"
        ).fetchone()
        cells = con.execute(
            f"SELECT {ent}, date_trunc('month', {ts}) AS m, count(*) AS n FROM {rel} GROUP BY ALL"
        ).fetch_arrow_table()
    finally:
        con.close()
    median_rate = monthly_median(cells, last) if events else 0.0
    months = ((last - first).total_seconds() / 86400 + 1) / DAYS_PER_MONTH if events else 0.0
    frequent = (median_rate or 0) >= FREQUENT
    need_months = MIN_MONTHS_FREQUENT if frequent else MIN_MONTHS_INFREQUENT
    per_month = events / months if months else 0.0
    checks = {
        f"main entities >= {MIN_ENTITIES:,}": entities >= MIN_ENTITIES,
        f"events per month >= {MIN_EVENTS_PER_MONTH:,}": per_month >= MIN_EVENTS_PER_MONTH,
        f"history >= {need_months} months ({'frequent' if frequent else 'infrequent'} interactions)": months
        >= need_months,
    }
    return {
        "events": int(events),
        "main_entities": int(entities),
        "first_day": first.date().isoformat() if first else None,
        "last_day": last.date().isoformat() if last else None,
        "months_of_history": round(months, 2),
        "events_per_month": round(per_month),
        "median_events_per_entity_month": float(median_rate or 0),
        "interactions": "frequent" if frequent else "infrequent",
        "checks": checks,
        "meets_guidelines": all(checks.values()),
        "extract_bytes": sum(f.stat().st_size for f in files),
    }


def monthly_median(cells, last) -> float:
    """Median events per entity per month, counting the months without events: every month from the
    entity's first month to the data's last month is a cell (sparse data has many empty ones).
    `cells`: (entity, month, n) of the months with events."""
    import numpy as np
    import pyarrow.compute as pc

    if cells.num_rows == 0:
        return 0.0
    month = pc.year(cells.column("m")).to_numpy() * 12 + pc.month(cells.column("m")).to_numpy()
    last_month = last.year * 12 + last.month
    ent = cells.column(0).to_numpy(zero_copy_only=False)
    _, inv = np.unique(ent.astype(str) if ent.dtype == object else ent, return_inverse=True)
    first = np.full(inv.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, inv, month)
    n = np.sort(cells.column("n").to_numpy())
    empty = int((last_month - first + 1).sum()) - len(n)  # entity-months without an event
    total = empty + len(n)
    ranks = [(total - 1) // 2, total // 2]
    values = [0.0 if r < empty else float(n[r - empty]) for r in ranks]
    return float(np.mean(values))


def volume_report(cfg: PipelineConfig) -> dict[str, Any]:
    """{source: measured numbers and guideline checks} for every event source."""
    return {src.name: source_volume(cfg, src) for src in cfg.sources("event")}
