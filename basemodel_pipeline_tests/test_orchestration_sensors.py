"""Sensors and the schedule on a persistent test instance: cursors advance, run keys repeat for the same
range (so Dagster de-duplicates them), nothing is requested twice, scenario partitions follow the config."""

import datetime as dt
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline.defs import build_assets, build_checks, build_definitions
from basemodel_pipeline.defs.extracts.files import content_version
from basemodel_pipeline.defs.extracts.sensors import build_new_data_sensor
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource

TX = dg.AssetKey(["extracts", "transactions"])


@pytest.fixture
def defs(tiny_config: Path, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    return build_definitions(str(tiny_config), env="ci")


def _tick(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, config: Path, cursor: str | None):
    sensor = next(s for s in defs.sensors if s.name == name)
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        definitions=defs,
        resources={"basemodel_config": BasemodelConfigResource(config_path=str(config))},
    )
    with dg.partition_loading_context(dynamic_partitions_store=instance):  # as the sensor daemon does
        return sensor.evaluate_tick(context)


def _add_day(config: Path, day: dt.date) -> None:
    """A new day lands in the source: copy the last event to `day`, noon."""
    path = config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    last = table.slice(table.num_rows - 1, 1)
    ts = pa.array(
        [dt.datetime.combine(day, dt.time(12))], type=table.schema.field("transaction_timestamp").type
    )
    last = last.set_column(last.schema.get_field_index("transaction_timestamp"), "transaction_timestamp", ts)
    pq.write_table(pa.concat_tables([table, last]), path)


def _extract(
    config: Path, instance: dg.DagsterInstance, tags: dict[str, str], raise_on_error: bool = True
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [*build_assets(str(config)), *build_checks(str(config))],
        instance=instance,
        selection=[TX],
        resources=build_definitions(str(config), env="ci").resources,
        tags=tags,
        raise_on_error=raise_on_error,
    )


def _launch(config: Path, instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """What the sensor daemon does with a request: a run tagged with its run key."""
    tags = {**request.tags, "dagster/run_key": request.run_key}
    return _extract(config, instance, tags, raise_on_error=False)


def test_new_data_sensor_cursor_run_keys_and_no_repeats(defs: dg.Definitions, tiny_config: Path) -> None:
    with dg.instance_for_test() as instance:
        first = _tick(defs, "new_data_sensor", instance, tiny_config, None)
        (request,) = first.run_requests
        assert request.run_key == "transactions:2023-01-01..2023-04-30"
        assert request.asset_selection == [TX]
        assert request.tags["dagster/asset_partition_range_start"] == "2023-01-01"
        assert request.tags["dagster/asset_partition_range_end"] == "2023-04-30"
        assert request.tags["dagster/max_runtime"]
        replay = _tick(defs, "new_data_sensor", instance, tiny_config, None)
        assert (
            replay.run_requests[0].run_key == request.run_key
        )  # a lost cursor repeats the key: de-duplicated

        second = _tick(defs, "new_data_sensor", instance, tiny_config, first.cursor)
        assert second.run_requests == [] and second.cursor == first.cursor  # nothing new

        assert _extract(tiny_config, instance, request.tags).success
        days = {
            mat.partition
            for mat in instance.fetch_materializations(TX, limit=1000).records
            and [r.asset_materialization for r in instance.fetch_materializations(TX, limit=1000).records]
        }
        assert {"2023-01-01", "2023-04-30"} <= days and len(days) == 120

        _add_day(tiny_config, dt.date(2023, 5, 2))
        third = _tick(defs, "new_data_sensor", instance, tiny_config, second.cursor)
        (new,) = third.run_requests
        assert (
            new.run_key == "transactions:2023-04-30..2023-05-02"
        )  # the cursor day again: it may have been partial
        assert '"day": "2023-05-02"' in third.cursor

        assert _extract(tiny_config, instance, new.tags).success
        assert (tiny_config.parent / "extracts" / "transactions" / "2023-05-02.parquet").exists()
        # a sensor that lost its cursor starts from the newest extracted day: nothing to request
        assert _tick(defs, "new_data_sensor", instance, tiny_config, None).run_requests == []


def test_new_data_sensor_retries_a_failed_range_with_a_doubling_bounded_delay(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed range is retried after 5 min, then 10, then at most the maximum (here 1000 s), each under a
    new run key; the skip reason says when; a success ends it, and the next failure waits 5 min again."""
    monkeypatch.setenv("BASEMODEL_EXTRACT_RETRY_BASE_S", "300")
    monkeypatch.setenv("BASEMODEL_EXTRACT_RETRY_MAX_S", "1000")
    clock = {"now": 0.0}  # the sensor's clock, moved by the test (set from each failed run's end time)
    sensor = build_new_data_sensor([TX], dg.DefaultSensorStatus.STOPPED, clock=lambda: clock["now"])
    source = tiny_config.parent / "data" / "transactions.parquet"

    def tick(cursor: str | None, at: float):
        clock["now"] = at
        resources = {"basemodel_config": BasemodelConfigResource(config_path=str(tiny_config))}
        return sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
        )

    def fail(request: dg.RunRequest) -> float:
        """Launch `request` while the source is away (a really failed run); the run's end time."""
        hidden = source.rename(source.with_name("away.parquet"))
        result = _launch(tiny_config, instance, request)
        hidden.rename(source)
        assert not result.success
        (record,) = instance.get_run_records(dg.RunsFilter(run_ids=[result.run_id]))
        return record.end_time

    def utc(ts: float) -> str:
        return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    with dg.instance_for_test() as instance:
        first = tick(None, 0.0)
        (request,) = first.run_requests
        cursor = first.cursor
        for attempt, delay in [(1, 300), (2, 600), (3, 1000), (4, 1000)]:  # doubles, then bounded
            failed_at = fail(request)
            waiting = tick(cursor, failed_at)
            assert waiting.run_requests == []
            assert f"attempt {attempt} failed at {utc(failed_at)}" in waiting.skip_message
            assert f"attempt {attempt + 1} at {utc(failed_at + delay)}" in waiting.skip_message
            assert tick(waiting.cursor, failed_at + delay - 1).run_requests == []  # not yet
            retry = tick(waiting.cursor, failed_at + delay)
            (request,) = retry.run_requests
            assert request.run_key == f"transactions:2023-01-01..2023-04-30#{attempt + 1}"  # a new key
            assert request.tags["dagster/asset_partition_range_start"] == "2023-01-01"
            assert request.tags["dagster/asset_partition_range_end"] == "2023-04-30"
            cursor = retry.cursor
            assert tick(cursor, failed_at + 10 * delay).run_requests == []  # its run has not finished yet

        assert _launch(tiny_config, instance, request).success
        done = tick(cursor, failed_at + 20_000)
        assert done.run_requests == [] and "pending" not in done.cursor
        _add_day(tiny_config, dt.date(2023, 5, 2))
        added = tick(done.cursor, failed_at + 20_000)
        (new,) = added.run_requests
        assert new.run_key == "transactions:2023-04-30..2023-05-02"
        failed_at = fail(new)  # a success reset the count: the base delay again
        waiting = tick(added.cursor, failed_at)
        assert f"attempt 2 at {utc(failed_at + 300)}" in waiting.skip_message
        (again,) = tick(waiting.cursor, failed_at + 300).run_requests
        assert again.run_key == "transactions:2023-04-30..2023-05-02#2"


def test_scenario_registry_adds_and_removes_partitions(defs: dg.Definitions, tiny_config: Path) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "retired_scenario"])
        result = _tick(defs, "scenario_registry_sensor", instance, tiny_config, None)
        adds = [
            r for r in result.dynamic_partitions_requests if isinstance(r, dg.AddDynamicPartitionsRequest)
        ]
        deletes = [
            r for r in result.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)
        ]
        assert [list(r.partition_keys) for r in adds] == [["department_propensity"]]
        assert [list(r.partition_keys) for r in deletes] == [["retired_scenario"]]
        # what the sensor daemon then applies
        instance.add_dynamic_partitions("scenarios", ["department_propensity"])
        instance.delete_dynamic_partition("scenarios", "retired_scenario")
        again = _tick(defs, "scenario_registry_sensor", instance, tiny_config, None)
        assert not again.dynamic_partitions_requests and not again.run_requests

        cfg = yaml.safe_load(tiny_config.read_text())
        cfg["scenarios"] = [s for s in cfg["scenarios"] if s["name"] != "churn"]
        tiny_config.write_text(yaml.safe_dump(cfg))
        removed = _tick(defs, "scenario_registry_sensor", instance, tiny_config, None)
        (delete,) = removed.dynamic_partitions_requests
        assert isinstance(delete, dg.DeleteDynamicPartitionsRequest) and list(delete.partition_keys) == [
            "churn"
        ]


def test_an_edited_scenario_or_foundation_config_retrains_that_model(
    defs: dg.Definitions, tiny_config: Path
) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "department_propensity"])
        first = _tick(defs, "scenario_registry_sensor", instance, tiny_config, None)
        assert not first.run_requests  # the first tick records the versions
        same = _tick(defs, "scenario_registry_sensor", instance, tiny_config, first.cursor)
        assert not same.run_requests

        cfg = yaml.safe_load(tiny_config.read_text())
        churn = next(s for s in cfg["scenarios"] if s["name"] == "churn")
        churn["epochs"] = 7
        tiny_config.write_text(yaml.safe_dump(cfg) + "# a comment changes nothing\n")
        edited = _tick(defs, "scenario_registry_sensor", instance, tiny_config, same.cursor)
        (request,) = edited.run_requests
        assert request.partition_key == "churn" and set(request.asset_selection or []) == {
            dg.AssetKey("scenario_baselines"),
            dg.AssetKey("scenario_model"),
            dg.AssetKey("predictions"),
        }
        assert not _tick(defs, "scenario_registry_sensor", instance, tiny_config, edited.cursor).run_requests

        cfg.setdefault("training_params", {}).setdefault("foundation", {})["sketch_width"] = 16
        tiny_config.write_text(yaml.safe_dump(cfg))
        foundation = _tick(defs, "scenario_registry_sensor", instance, tiny_config, edited.cursor)
        assert [r.asset_selection for r in foundation.run_requests] == [[dg.AssetKey("foundation_model")]]


def test_sensors_skip_until_the_config_exists(defs: dg.Definitions, tmp_path: Path) -> None:
    with dg.instance_for_test() as instance:
        for name in ("new_data_sensor", "scenario_registry_sensor"):
            result = _tick(defs, name, instance, tmp_path / "missing.yaml", None)
            assert "does not exist yet" in (result.skip_message or "")


def _nightly(defs: dg.Definitions, instance: dg.DagsterInstance, config: Path, night: dt.date):
    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=dt.datetime.combine(night, dt.time(2), tzinfo=dt.UTC),
        resources={"basemodel_config": BasemodelConfigResource(config_path=str(config))},
    )
    return defs.resolve_schedule_def("nightly_refresh").evaluate_tick(context)


def test_nightly_schedule_requests_the_new_days_once_per_night(
    defs: dg.Definitions, tiny_config: Path
) -> None:
    with dg.instance_for_test() as instance:
        (request,) = _nightly(defs, instance, tiny_config, dt.date(2023, 5, 3)).run_requests
        assert request.run_key == "nightly-2023-05-03"
        assert request.tags["dagster/asset_partition_range_start"] == "2023-01-01"  # nothing extracted yet
        assert request.tags["dagster/asset_partition_range_end"] == "2023-04-30"  # the source's last day


def test_nightly_schedule_on_historical_data_asks_only_for_days_that_exist(
    defs: dg.Definitions, tiny_config: Path
) -> None:
    from basemodel_pipeline.config import load_config
    from basemodel_pipeline.pipeline import run_extract

    run_extract(load_config(tiny_config))
    with dg.instance_for_test() as instance:
        years_later = _nightly(defs, instance, tiny_config, dt.date(2026, 6, 1))
        assert not years_later.run_requests and "no new event day" in (years_later.skip_message or "")
        _add_day(tiny_config, dt.date(2023, 5, 2))
        (request,) = _nightly(defs, instance, tiny_config, dt.date(2026, 6, 2)).run_requests
        assert request.tags["dagster/asset_partition_range_start"] == "2023-04-30"
        assert request.tags["dagster/asset_partition_range_end"] == "2023-05-02"


def test_extract_rows_per_day_match_the_source(tiny_config: Path) -> None:
    with dg.instance_for_test() as instance:
        tags = _range("2023-02-01", "2023-02-07")
        result = _extract(tiny_config, instance, tags)
        assert result.success
        mats = result.asset_materializations_for_node("extracts__transactions")
        assert sorted(m.partition for m in mats) == [f"2023-02-0{d}" for d in range(1, 8)]
        source = pq.read_table(tiny_config.parent / "data" / "transactions.parquet")
        ts = source.column("transaction_timestamp")
        in_range = pc.and_(  # the config's where_condition: quantity > 0
            pc.and_(
                pc.greater_equal(ts, pa.scalar(dt.datetime(2023, 2, 1), ts.type)),
                pc.less(ts, pa.scalar(dt.datetime(2023, 2, 8), ts.type)),
            ),
            pc.greater(source.column("quantity"), 0),
        )
        assert mats[0].metadata["range_rows"].value == pc.sum(in_range).as_py()
        assert mats[0].metadata["days"].value == 7
        assert isinstance(mats[0].metadata["dagster/column_schema"].value, dg.TableSchema)


def test_a_range_run_reports_the_repeated_rows_it_wrote(tiny_config: Path) -> None:
    """The tiny source repeats some rows exactly (a product twice in a basket, its basket id not extracted):
    the range's materializations carry their count, as DuckDB's DISTINCT over the days written counts them."""
    import duckdb

    with dg.instance_for_test() as instance:
        tags = _range("2023-01-01", "2023-01-31")
        result = _extract(tiny_config, instance, tags)
        assert result.success
        files = str(tiny_config.parent / "extracts" / "transactions" / "2023-01-*.parquet")
        rows = f"FROM read_parquet('{files}')"
        (expected,) = duckdb.execute(
            f"SELECT count(*) - (SELECT count(*) FROM (SELECT DISTINCT * {rows})) {rows}"
        ).fetchone()
        assert expected > 0
        for mat in result.asset_materializations_for_node("extracts__transactions"):
            assert mat.metadata["duplicate_rows"].value == expected


def _source_rows(config: Path, day: dt.date) -> int:
    """Rows of `day` in the source after the config's where_condition (quantity > 0)."""
    source = pq.read_table(config.parent / "data" / "transactions.parquet")
    ts = source.column("transaction_timestamp")
    start = pa.scalar(dt.datetime.combine(day, dt.time()), ts.type)
    end = pa.scalar(dt.datetime.combine(day + dt.timedelta(days=1), dt.time()), ts.type)
    keep = pc.and_(pc.and_(pc.greater_equal(ts, start), pc.less(ts, end)), pc.greater(source["quantity"], 0))
    return pc.sum(keep).as_py()


def test_a_range_run_records_each_days_own_row_count(tiny_config: Path) -> None:
    days = [dt.date(2023, 3, 1) + dt.timedelta(days=i) for i in range(3)]
    with dg.instance_for_test() as instance:
        tags = _range(days[0].isoformat(), days[-1].isoformat())
        assert _extract(tiny_config, instance, tags).success
        counts = [_source_rows(tiny_config, day) for day in days]
        assert len(set(counts)) > 1  # the days differ, so a shared total would show
        for day, expected in zip(days, counts, strict=True):
            (record,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=TX, asset_partitions=[day.isoformat()]), limit=1
            ).records
            metadata = record.asset_materialization.metadata
            assert metadata["dagster/row_count"].value == expected, day
            assert metadata["rows"].value == expected, day
            assert metadata["range_rows"].value == sum(counts)


def test_re_extracting_unchanged_days_keeps_the_data_version(tiny_config: Path) -> None:
    """The extract's data version is its content: an unchanged re-extraction triggers nothing downstream."""
    tags = _range("2023-03-01", "2023-03-03")

    def version(instance: dg.DagsterInstance) -> str:
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=TX, asset_partitions=["2023-03-02"]), limit=1
        ).records
        return record.asset_materialization.tags["dagster/data_version"]

    with dg.instance_for_test() as instance:
        assert _extract(tiny_config, instance, tags).success
        first = version(instance)
        assert _extract(tiny_config, instance, tags).success
        assert version(instance) == first
        _add_day(tiny_config, dt.date(2023, 3, 2))  # a late event lands on that day
        assert _extract(tiny_config, instance, tags).success
        assert version(instance) != first


def _range(first: str, last: str) -> dict[str, str]:
    return {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}


def _day_versions(instance: dg.DagsterInstance, days: list[str]) -> dict[str, str]:
    """The data version each day partition's latest materialization recorded."""
    versions = {}
    for day in days:
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=TX, asset_partitions=[day]), limit=1
        ).records
        versions[day] = record.asset_materialization.tags["dagster/data_version"]
    return versions


def test_overlapping_ranges_keep_each_days_version_and_only_a_changed_day_rebuilds_the_cache(
    defs: dg.Definitions, tiny_config: Path
) -> None:
    """Each day partition's data version is the hash of its own file, whatever range extracted it:
    re-extracting unchanged days in another range changes no version and requests no cache; a changed day
    changes its own version only, and the cache is requested."""
    cache = dg.AssetKey("event_cache")
    directory = tiny_config.parent / "extracts" / "transactions"
    days = ["2023-04-28", "2023-04-29", "2023-04-30", "2023-05-01"]  # 05-01: after the source's last event

    def content_hashes() -> dict[str, str]:
        files = {day: directory / f"{day}.parquet" for day in days}
        return {day: content_version([file] if file.is_file() else []) for day, file in files.items()}

    with dg.instance_for_test() as instance:
        assert _extract(tiny_config, instance, _range("2023-04-27", "2023-05-01")).success
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance)  # records the state
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert tick.get_num_requested(cache) == 0
        first = _day_versions(instance, days)
        assert not (directory / "2023-05-01.parquet").exists()  # a day without events has no file...
        assert first == content_hashes()  # ...and a stable version all the same

        again = _extract(tiny_config, instance, _range("2023-04-28", "2023-05-01"))  # another first day
        assert again.success
        mats = again.asset_materializations_for_node("extracts__transactions")
        assert sorted(m.partition for m in mats) == days  # one materialization per day
        assert _day_versions(instance, days) == first
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert tick.get_num_requested(cache) == 0  # byte-identical days: nothing downstream

        _add_day(tiny_config, dt.date(2023, 4, 29))  # a late event lands on that day
        assert _extract(tiny_config, instance, _range("2023-04-28", "2023-05-01")).success
        changed = _day_versions(instance, days)
        assert changed == content_hashes()
        assert {day for day in days if changed[day] != first[day]} == {"2023-04-29"}
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert tick.get_num_requested(cache) == 1
