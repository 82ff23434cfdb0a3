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


def test_every_source_extracts_in_contiguous_chunks(tiny_config: Path) -> None:
    """Remote sources and local Parquet alike: one scan of the whole history held DuckDB's partitioned day
    write in memory (2.3 GB at 50M events, outside its memory limit); 31-day chunks bound it."""
    from test_sources_support import relocate

    from basemodel_pipeline.sources.extract import CHUNK_DAYS, chunks

    cfg = load_config(tiny_config)
    start = cfg.data_params.data_start_date
    days = (start, start + (2 * CHUNK_DAYS + 5) * DAY)
    params = {"account": "a", "user": "u", "database": "D", "schema": "S"}
    location = {"database_type": "snowflake", "table_name": "EVENTS", "connection_params": params}
    remote = load_config(relocate(tiny_config, {"transactions": location}))
    for c in (cfg, remote):
        parts = chunks(c, c.source("transactions"), days)
        assert len(parts) == 3 and parts[0][0] == days[0] and parts[-1][1] == days[1]
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
        assert all(b - a <= CHUNK_DAYS * DAY for a, b in parts)


def test_a_local_extract_writes_one_chunk_of_days_at_a_time(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole history comes out in chunks of at most CHUNK_DAYS days (each its own partitioned write),
    with the same day files as before."""
    from basemodel_pipeline.sources import extract

    cfg = load_config(tiny_config)
    seen: list[int] = []
    real = extract.write_days

    def counting(*args: object, **kwargs: object) -> list[str]:
        written = real(*args, **kwargs)
        seen.append(len(written))
        return written

    monkeypatch.setattr(extract, "write_days", counting)
    run_extract(cfg, "transactions")
    files = day_files(cfg)
    assert len(seen) > 1 and max(seen) <= extract.CHUNK_DAYS and sum(seen) == len(files), (seen, len(files))


def day_hashes(cfg) -> dict[str, str]:
    """Day file name -> sha256 of the transactions extract."""
    from basemodel_pipeline.manifests import sha256_file

    d = Path(cfg.workspace) / "extracts" / "transactions"
    return {p.name: sha256_file(p) for p in sorted(d.glob("*.parquet"))}


def shuffled(table: pa.Table, seed: int) -> pa.Table:
    """The same rows in another order (rows of one timestamp too); the same few rows have NULLs to order."""
    import numpy as np

    col = table.schema.get_field_index("coupon_disc")
    values = table.column(col).to_pylist()
    nulls = pa.array([None if i % 50 == 0 else v for i, v in enumerate(values)], table.schema.field(col).type)
    table = table.set_column(col, "coupon_disc", nulls)
    return table.take(pa.array(np.random.default_rng(seed).permutation(table.num_rows)))


def test_extracts_are_byte_identical_whatever_the_source_row_order(tiny_config: Path) -> None:
    from basemodel_pipeline.pipeline import run_cache

    cfg = load_config(tiny_config)
    path = Path(cfg.source("transactions").data_location.path)
    original = pq.read_table(path)
    last = pc.max(original["transaction_timestamp"]).as_py().date()
    before_last = pc.less(original["transaction_timestamp"], pa.scalar(dt.datetime.combine(last, dt.time())))
    pq.write_table(shuffled(original.filter(before_last), 0), path)
    run_extract(cfg)
    first = day_hashes(cfg)
    built = run_cache(cfg)

    pq.write_table(shuffled(original.filter(before_last), 1), path, row_group_size=1000)
    run_extract(cfg, "transactions")
    assert day_hashes(cfg) == first  # every day, whole extract
    mid = cfg.data_params.data_start_date + 20 * DAY
    run_extract(cfg, "transactions", days=(mid, mid + 10 * DAY))
    assert day_hashes(cfg) == first  # a range
    again = run_cache(cfg)
    assert again["reused"] and again["data_version"] == built["data_version"]

    pq.write_table(shuffled(original, 2), path)  # the last day arrives, the rest reshuffled
    run_extract(cfg, "transactions")
    now = day_hashes(cfg)
    assert {k: v for k, v in now.items() if k in first} == first
    appended = run_cache(cfg)
    assert not appended["reused"] and appended["appends"] == 1  # the append path, not a rebuild
    assert appended["max_date"] == last.isoformat()


def test_day_files_are_deterministic_with_many_threads_and_row_groups(tmp_path: Path) -> None:
    import numpy as np

    from basemodel_pipeline.manifests import sha256_file
    from basemodel_pipeline.sources.extract import write_days, write_table

    n = 300_000  # more than two of DuckDB's row groups in one day
    rng = np.random.default_rng(0)
    ts = np.datetime64("2024-03-01T00:00:00", "us") + rng.integers(0, 2 * 86400, n // 10).repeat(10) * 10**6
    events = pa.table(
        {
            "entity": pa.array(rng.integers(0, 50, n)),
            "item": pa.array(np.where(rng.random(n) < 0.1, None, rng.integers(0, 9, n).astype(str))),
            "value": pa.array(rng.integers(0, 3, n).astype(float)),
            "ts": pa.array(ts, pa.timestamp("us")),
        }
    )
    digests = []
    for seed in range(3):
        out = tmp_path / str(seed)
        out.mkdir()
        rows = events.take(pa.array(np.random.default_rng(seed).permutation(n)))
        reader = pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches(max_chunksize=7_000))
        assert write_days(reader, out, "ts", "1GB", entity="entity", threads=8) == [
            "2024-03-01.parquet",
            "2024-03-02.parquet",
        ]
        table = rows.filter(pc.less(rows["entity"], 5))  # an attribute table: the same rows, reordered
        write_table(
            pa.RecordBatchReader.from_batches(table.schema, table.to_batches(1_000)), out, "entity", 8
        )
        digests.append({p.name: sha256_file(p) for p in sorted(out.glob("*.parquet"))})
    assert digests[0] == digests[1] == digests[2]
    day = pq.read_table(tmp_path / "0" / "2024-03-01.parquet")
    assert pq.read_metadata(tmp_path / "0" / "2024-03-01.parquet").num_row_groups > 1
    keys = day.select(["ts", "entity"]).to_pylist()
    assert keys == sorted(keys, key=lambda r: (r["ts"], r["entity"]))


def _stamp_future_events(config: Path, n: int = 20, when: dt.datetime = dt.datetime(2100, 1, 1, 12)) -> None:
    """n events of the source re-stamped 2100-01-01 (a broken clock upstream), or `when`."""
    path = config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    future = table.slice(0, n)
    column = "transaction_timestamp"
    stamps = pa.array([when] * n, type=table.schema.field(column).type)
    future = future.set_column(future.schema.get_field_index(column), column, stamps)
    pq.write_table(pa.concat_tables([table, future]), path)


def test_future_events_are_dropped_with_a_count_and_do_not_move_the_as_of_date(tiny_config: Path) -> None:
    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.pipeline import run_cache

    _stamp_future_events(tiny_config)
    cfg = load_config(tiny_config)
    meta = run_extract(cfg)["transactions"]
    assert meta["future_events_dropped"] == 20
    assert not (Path(meta["path"]) / "2100-01-01.parquet").exists()
    with EventCache(run_cache(cfg)["path"]) as cache:
        assert cache.max_date < dt.date(2024, 1, 1)  # the default "as of" stays at the data's end


def test_future_events_policy_error_and_keep(tiny_config: Path) -> None:
    from basemodel_pipeline.errors import DataError

    _stamp_future_events(tiny_config, n=3)
    text = tiny_config.read_text().replace(
        "  split_interval_days: 7", "  split_interval_days: 7\n  future_events: error"
    )
    tiny_config.write_text(text)
    with pytest.raises(DataError, match=r"3 events are stamped after .* \(2100-01-01\.\.2100-01-01\)"):
        run_extract(load_config(tiny_config), "transactions")
    tiny_config.write_text(text.replace("future_events: error", "future_events: keep"))
    meta = run_extract(load_config(tiny_config), "transactions")["transactions"]
    assert "future_events_dropped" not in meta and (Path(meta["path"]) / "2100-01-01.parquet").exists()


def _future_events_policy(config: Path, policy: str) -> None:
    text = config.read_text().replace(
        "  split_interval_days: 7", f"  split_interval_days: 7\n  future_events: {policy}"
    )
    config.write_text(text)


def test_an_event_at_the_end_of_time_is_one_line_not_an_overflow(tiny_config: Path) -> None:
    """Before: one event at 9999-12-31 ended `validate` and `extract` in an OverflowError traceback. Now
    `validate` passes on the data's real end and `extract` drops it with one warning line; with
    future_events: keep it is still dropped (no timestamp the pipeline stores reaches past 2262-04-10), and with
    error the extract fails with one line before writing a day."""
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app

    _stamp_future_events(tiny_config, n=1, when=dt.datetime(9999, 12, 31, 12))
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(tiny_config)])
    assert result.exit_code == 0 and "Traceback" not in result.output, (result.output, result.exception)
    result = runner.invoke(app, ["extract", str(tiny_config), "--source", "transactions"])
    assert result.exit_code == 0, (result.output, result.exception)
    logged = " ".join(result.stderr.split())  # the log line, unwrapped
    assert logged.count("events are stamped") == 1 and "1 events are stamped after" in logged, logged
    assert "(9999-12-31..9999-12-31)" in logged and "They were dropped" in logged
    extracts = tiny_config.parent / "extracts" / "transactions"
    assert max(p.stem for p in extracts.glob("*.parquet")) < "2024"

    _future_events_policy(tiny_config, "keep")
    result = runner.invoke(app, ["extract", str(tiny_config), "--source", "transactions"])
    assert result.exit_code == 0, (result.output, result.exception)
    logged = " ".join(result.stderr.split())
    assert logged.count("events are stamped") == 1 and "1 events are stamped on or after 2262-04-11" in logged
    assert max(p.stem for p in extracts.glob("*.parquet")) < "2024"

    tiny_config.write_text(tiny_config.read_text().replace("future_events: keep", "future_events: error"))
    before = {p.name: p.stat().st_mtime_ns for p in extracts.glob("*.parquet")}
    result = runner.invoke(app, ["extract", str(tiny_config), "--source", "transactions"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # and the progress bar
    assert len(lines) == 1 and "1 events are stamped after" in lines[0], result.stderr
    assert "(9999-12-31..9999-12-31)" in lines[0]
    assert {p.name: p.stat().st_mtime_ns for p in extracts.glob("*.parquet")} == before


def _counted_queries(cfg, monkeypatch: pytest.MonkeyPatch) -> int:
    """Source queries the extract of transactions runs (one per chunk of days)."""
    from basemodel_pipeline.sources import extract

    calls = []
    real = extract.query_for

    def counting(*args: object, **kwargs: object) -> str:
        calls.append(args[3] if len(args) > 3 else kwargs.get("days"))
        return real(*args, **kwargs)

    monkeypatch.setattr(extract, "query_for", counting)
    run_extract(cfg, "transactions")
    monkeypatch.undo()
    return len(calls)


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_a_handful_of_far_future_events_adds_no_chunks_to_the_extract(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """Before: 20 events at 2100-01-01 made the extract query every 31-day chunk up to 2100 (about 900
    queries: 2 s became 49 s), although they were dropped at the end. Chunks now end at the data's real end
    (drop), and an empty chunk skips ahead to the next event day (keep)."""
    from basemodel_pipeline.sources import day_bound
    from basemodel_pipeline.sources.extract import chunks

    _future_events_policy(tiny_config, policy)
    baseline = _counted_queries(load_config(tiny_config), monkeypatch)
    _stamp_future_events(tiny_config)
    cfg = load_config(tiny_config)
    queries = _counted_queries(cfg, monkeypatch)
    extracts = Path(cfg.workspace) / "extracts" / "transactions"
    if policy == "drop":
        assert queries == baseline
        assert not (extracts / "2100-01-01.parquet").exists()
    else:
        assert queries <= baseline + 2, (queries, baseline)
        assert (extracts / "2100-01-01.parquet").exists()
    # a day range asked up to the end of time is cut at the last day an extract can hold
    src, start = cfg.source("transactions"), cfg.data_params.data_start_date
    parts = chunks(cfg, src, (start, dt.date(9999, 12, 31)))
    assert parts[-1][1] == day_bound(cfg)


def test_a_symlinked_extract_directory_keeps_files_the_extract_did_not_write(
    tiny_config: Path, tmp_path: Path
) -> None:
    """extracts/<source> is a symlink to another volume where the user keeps Parquet files of their own (one
    named like a day file): the extract never deletes them and refuses to run beside them (the cache would
    read them as data), in one line naming them; moved away, the extract runs and keeps its record."""
    cfg = load_config(tiny_config)
    volume = tmp_path / "volume"
    volume.mkdir()
    link = Path(cfg.workspace) / "extracts" / "transactions"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(volume, target_is_directory=True)
    run_extract(cfg, "transactions")
    days = day_files(cfg)
    theirs = {"2001-01-01.parquet": b"mine", "backup.parquet": b"also mine"}
    for name, data in theirs.items():
        (volume / name).write_bytes(data)

    with pytest.raises(
        UserError, match=r"2001-01-01\.parquet and 1 more: not written by the extract of source"
    ):
        run_extract(cfg, "transactions")
    assert all((volume / n).read_bytes() == d for n, d in theirs.items())  # nothing of theirs touched
    for name in theirs:
        (volume / name).rename(tmp_path / name)
    run_extract(cfg, "transactions")
    assert set(day_files(cfg)) == set(days)  # the same day files, rewritten


def test_events_after_a_historical_data_sets_end_are_left_out_with_a_count_whatever_the_policy(
    tiny_config: Path,
) -> None:
    """data_params.data_end_date closes a data set that receives no new days: nothing after it is extracted
    (counted in the metadata, not treated as a broken clock, even with future_events: error)."""
    from basemodel_pipeline.pipeline import run_cache

    end = dt.date(2023, 4, 15)
    text = tiny_config.read_text().replace(
        "  split_interval_days: 7",
        f"  split_interval_days: 7\n  future_events: error\n  data_end_date: {end}",
    )
    tiny_config.write_text(text)
    cfg = load_config(tiny_config)
    meta = run_extract(cfg)["transactions"]
    days = sorted(p.stem for p in Path(meta["path"]).glob("*.parquet"))
    assert days[-1] == end.isoformat()
    assert meta["events_after_data_end_date"] > 0
    assert run_cache(cfg)["path"]


def test_future_events_are_counted_as_future_when_the_data_end_date_lies_further_ahead(
    tiny_config: Path,
) -> None:
    """With data_end_date beyond tomorrow the extract's bound is tomorrow's, so what it leaves out is future
    events (the future_events policy and its metadata key), not events after the data's end."""
    _stamp_future_events(tiny_config)
    text = tiny_config.read_text().replace(
        "  split_interval_days: 7", "  split_interval_days: 7\n  data_end_date: 2200-01-01"
    )
    tiny_config.write_text(text)
    meta = run_extract(load_config(tiny_config))["transactions"]
    assert meta["future_events_dropped"] == 20
    assert "events_after_data_end_date" not in meta
