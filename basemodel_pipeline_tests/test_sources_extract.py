"""Incremental extraction: a day range rewrites exactly its days; the watermark is the latest event day."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import watermark

DAY = dt.timedelta(days=1)


def day_files(cfg) -> dict[str, int]:
    """Day file name -> mtime_ns of the transactions extract."""
    d = Path(cfg.workspace) / "extracts" / "transactions"
    return {p.name: p.stat().st_mtime_ns for p in sorted(d.glob("*.parquet"))}


def rewrite_source(cfg, edit) -> None:
    path = Path(cfg.source("transactions").data_location.path)
    pq.write_table(edit(pq.read_table(path)), path)


def late_row(table: pa.Table, when: dt.datetime) -> pa.Table:
    """One more copy of the first row, at `when`."""
    row = table.slice(0, 1)
    col = table.schema.get_field_index("transaction_timestamp")
    row = row.set_column(col, "transaction_timestamp", pa.array([when], table.schema.field(col).type))
    return pa.concat_tables([table, row])


def rows_of(cfg, day: dt.date) -> int:
    return pq.read_metadata(Path(cfg.workspace) / "extracts" / "transactions" / f"{day}.parquet").num_rows


def test_late_day_rewrites_only_that_day(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    run_extract(cfg, "transactions")
    before = day_files(cfg)
    late = cfg.data_params.data_start_date + 40 * DAY
    n_late = rows_of(cfg, late)
    rewrite_source(cfg, lambda t: late_row(t, dt.datetime.combine(late, dt.time(12))))

    result = run_extract(cfg, "transactions", days=(late, late + DAY))["transactions"]

    after = day_files(cfg)
    assert set(after) == set(before)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {f"{late}.parquet"}
    assert rows_of(cfg, late) == n_late + 1
    assert result["files"] == len(before)
    assert result["rows"] == sum(pq.read_metadata(Path(result["path"]) / name).num_rows for name in after)


def test_day_range_is_idempotent_and_drops_vanished_days(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    run_extract(cfg, "transactions")
    start = cfg.data_params.data_start_date + 10 * DAY
    end = start + 3 * DAY
    gone = start + DAY
    outside = day_files(cfg)[f"{end}.parquet"]

    def drop_day(t: pa.Table) -> pa.Table:
        days = pc.cast(pc.floor_temporal(t["transaction_timestamp"], unit="day"), pa.date32())
        return t.filter(pc.not_equal(days, pa.scalar(gone, pa.date32())))

    rewrite_source(cfg, drop_day)
    first = run_extract(cfg, "transactions", days=(start, end))["transactions"]
    contents = {
        name: pq.read_table(Path(first["path"]) / name).sort_by("transaction_timestamp")
        for name in day_files(cfg)
    }
    second = run_extract(cfg, "transactions", days=(start, end))["transactions"]

    assert f"{gone}.parquet" not in day_files(cfg)
    assert day_files(cfg)[f"{end}.parquet"] == outside  # outside the range: untouched
    assert first["rows"] == second["rows"]
    for name, table in contents.items():
        again = pq.read_table(Path(second["path"]) / name).sort_by("transaction_timestamp")
        assert again.equals(table), name


def test_empty_day_range_is_a_user_error(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    day = cfg.data_params.data_start_date
    with pytest.raises(UserError, match="end day is exclusive"):
        run_extract(cfg, "transactions", days=(day, day))


def test_watermark_is_latest_event_day(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    src = cfg.source("transactions")
    table = pq.read_table(src.data_location.path)
    latest = pc.max(table["transaction_timestamp"]).as_py().date()
    assert watermark(cfg, src) == latest
    later = latest + 5 * DAY
    rewrite_source(cfg, lambda t: late_row(t, dt.datetime.combine(later, dt.time(23, 59))))
    assert watermark(cfg, src) == later
    with pytest.raises(UserError, match="only event sources have a watermark"):
        watermark(cfg, cfg.source("products"))


def test_cli_extract_day_range(tiny_config: Path) -> None:
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app

    cfg = load_config(tiny_config)
    run_extract(cfg, "transactions")
    before = day_files(cfg)
    day = cfg.data_params.data_start_date + 30 * DAY
    args = [
        "extract",
        str(tiny_config),
        "--source",
        "transactions",
        "--from",
        str(day),
        "--to",
        str(day + DAY),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    after = day_files(cfg)
    assert {n for n in after if after[n] != before[n]} == {f"{day}.parquet"}
    result = CliRunner().invoke(app, ["extract", str(tiny_config), "--from", str(day)])
    assert result.exit_code == 2 and "--from and --to go together" in result.stderr
    result = CliRunner().invoke(app, ["extract", str(tiny_config), "--source", "nope"])
    assert result.exit_code == 2 and "unknown data source 'nope'" in result.stderr


def test_remote_sources_extract_in_contiguous_chunks(tiny_config: Path) -> None:
    from test_sources_support import relocate

    from basemodel_pipeline.sources.extract import CHUNK_DAYS, chunks

    cfg = load_config(tiny_config)
    start = cfg.data_params.data_start_date
    days = (start, start + (2 * CHUNK_DAYS + 5) * DAY)
    assert chunks(cfg, cfg.source("transactions"), days) == [days]  # local Parquet: one scan
    params = {"account": "a", "user": "u", "database": "D", "schema": "S"}
    location = {"database_type": "snowflake", "table_name": "EVENTS", "connection_params": params}
    remote = load_config(relocate(tiny_config, {"transactions": location}))
    parts = chunks(remote, remote.source("transactions"), days)
    assert len(parts) == 3 and parts[0][0] == days[0] and parts[-1][1] == days[1]
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    assert all(b - a <= CHUNK_DAYS * DAY for a, b in parts)
