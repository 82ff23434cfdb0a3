"""Asset checks: real extracts, a real cache and a real (tiny) training run, with their verdicts."""

import datetime as dt
import json
import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs import build_assets, build_checks, build_definitions
from basemodel_pipeline.defs.cache.checks import manifest_problems
from basemodel_pipeline.defs.extracts.checks import day_volume_problems
from basemodel_pipeline.defs.materialize import RunFailed, materialize_all
from basemodel_pipeline.defs.shared.execution import latest_metadata
from basemodel_pipeline.defs.shared.resources import QualityGates
from basemodel_pipeline.pipeline import run_cache, run_extract

PRODUCTS = dg.AssetKey(["extracts", "products"])


def _run(config: Path, instance: dg.DagsterInstance, selection, **kwargs) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [*build_assets(str(config)), *build_checks(str(config))],
        instance=instance,
        selection=selection,
        resources=build_definitions(str(config), env="ci").resources,
        raise_on_error=False,
        **kwargs,
    )


def _check_results(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.asset_check_key.name: e for e in result.get_asset_check_evaluations()}


def _retype_manufacturer_id(config: Path) -> None:
    path = config.parent / "data" / "products.parquet"
    table = pq.read_table(path)
    ids = table.column("manufacturer_id").cast(pa.string())
    pq.write_table(
        table.set_column(table.schema.get_field_index("manufacturer_id"), "manufacturer_id", ids), path
    )


def _accept_new_schema(config: Path, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """What an operator does in the UI: run the check once with accept_new_schema."""
    return _run(
        config,
        instance,
        dg.AssetSelection.checks(dg.AssetCheckKey(PRODUCTS, "schema_unchanged")),
        run_config={"ops": {"extracts__products_schema_unchanged": {"config": {"accept_new_schema": True}}}},
    )


def test_schema_change_blocks_the_cache_until_accepted(tiny_config: Path) -> None:
    with dg.instance_for_test() as instance:
        first = _run(tiny_config, instance, [PRODUCTS])
        assert first.success and _check_results(first)["schema_unchanged"].passed

        _retype_manufacturer_id(tiny_config)  # the feed now sends ids as text
        changed = _run(tiny_config, instance, [PRODUCTS, dg.AssetKey("event_cache")])
        assert not changed.success  # blocking: the cache does not run on a changed schema
        verdict = _check_results(changed)["schema_unchanged"]
        assert not verdict.passed and "retyped manufacturer_id int64 -> string" in verdict.description
        materialized = {e.asset_key for e in changed.get_asset_materialization_events()}
        assert dg.AssetKey("event_cache") not in materialized

        accept = _accept_new_schema(tiny_config, instance)
        assert accept.success and _check_results(accept)["schema_unchanged"].passed
        again = _run(tiny_config, instance, [PRODUCTS])
        assert again.success and _check_results(again)["schema_unchanged"].passed  # the new baseline


def test_a_failed_schema_check_holds_the_cache_back_in_later_runs(tiny_config: Path) -> None:
    """The automation never rebuilds the cache from an extract whose blocking check failed in an earlier run."""
    cache = dg.AssetKey("event_cache")
    defs = build_definitions(str(tiny_config), env="ci")
    with dg.instance_for_test() as instance:
        assert _run(tiny_config, instance, [PRODUCTS]).success
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance)  # records the state

        _retype_manufacturer_id(tiny_config)
        failed = _run(tiny_config, instance, [PRODUCTS])  # the extract alone: its check fails in this run
        assert not _check_results(failed)["schema_unchanged"].passed
        for _ in range(2):
            tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
            assert tick.get_num_requested(cache) == 0

        accept = _accept_new_schema(tiny_config, instance)
        assert accept.success
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert tick.get_num_requested(cache) == 1  # the changed extract, now accepted, flows on


def test_cache_manifest_check_finds_corruption(tiny_config: Path, tmp_path: Path) -> None:
    cfg = load_config(tiny_config)
    run_extract(cfg)
    cache_dir = Path(run_cache(cfg)["path"])
    copy = Path(shutil.copytree(cache_dir, tmp_path / "cache_copy"))
    problems, files, size = manifest_problems(copy)
    assert problems == [] and files > 5 and size > 0

    victim = next(p for p in sorted(copy.rglob("*.npy")) if p.stat().st_size > 200)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # same size, different content
    victim.write_bytes(bytes(data))
    (copy / "stray.bin").write_bytes(b"x")
    (copy / "entities.parquet").unlink()
    problems, _, _ = manifest_problems(copy)
    rel = str(victim.relative_to(copy))
    assert f"{rel}: changed after the cache was written (sha256 differs from manifest.json)" in problems
    assert "entities.parquet: missing" in problems and "stray.bin: not in the manifest" in problems
    assert manifest_problems(tmp_path)[0] == [f"{tmp_path / 'manifest.json'} is missing"]


def test_volume_guidelines_flag_days_far_from_the_trailing_median() -> None:
    start = dt.date(2024, 1, 1)
    rows = {start + dt.timedelta(days=i): 100 for i in range(30)}
    rows[start + dt.timedelta(days=30)] = 5  # a feed that broke
    rows[start + dt.timedelta(days=31)] = 100
    gates = QualityGates()
    problems, meta = day_volume_problems(
        rows, (start + dt.timedelta(days=29), start + dt.timedelta(days=32)), gates
    )
    assert problems == ["2024-01-31: 5 rows, 0.05x the trailing median 100"]
    assert meta == {"days_checked": 3, "days_flagged": 1}
    assert day_volume_problems(rows, None, gates)[0] == []  # the newest day is fine
    few = {start: 100, start + dt.timedelta(days=1): 1}
    assert day_volume_problems(few, None, gates) == ([], {"days_checked": 0, "days_flagged": 0})


@pytest.mark.timeout(600)
def test_a_retrain_below_its_floor_is_neither_served_nor_scored(tiny_config: Path) -> None:
    cfg = yaml.safe_load(tiny_config.read_text())
    cfg["scenarios"] = [s for s in cfg["scenarios"] if s["name"] == "churn"]
    tiny_config.write_text(yaml.safe_dump(cfg))
    root = tiny_config.parent / "checkpoints" / "scenarios" / "churn"
    gates = QualityGates(metric_floor=0.999, popularity_margin=0.0)
    with dg.instance_for_test() as instance:
        materialize_all(tiny_config, instance, env="ci")  # ci's gates let the first model through
        served = (root / "LATEST").read_text().strip()
        scored = latest_metadata(instance, dg.AssetKey("predictions"), "churn")
        assert scored is not None and (root / served).is_dir()
        summary = (tiny_config.parent / "reports" / "summary.json").read_text()
        with pytest.raises(
            RunFailed,
            match=r"scenario churn: check scenario_model:.*test_metric_above_floor failed: test auroc 0\.\d+ vs floor 0\.9990",
        ):
            materialize_all(tiny_config, instance, env="ci", resource_overrides={"quality_gates": gates})
        # the retrain trained and was checked; the blocking check kept its predictions from being written
        model = latest_metadata(instance, dg.AssetKey("scenario_model"), "churn")
        assert model is not None and Path(model["report_file"]).name == "metrics.json"  # linked in the UI
        assert latest_metadata(instance, dg.AssetKey("predictions"), "churn") == scored
        check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(dg.AssetKey("foundation_model"), "loss_finite_and_improving")]
        )
        assert check  # the foundation's loss check ran in the upstream run
    # the step judged its own version by the same gate and never made it current: what predict, the summary
    # and retention read is still the first model
    assert model["promoted"] is False and model["version"] != served
    assert model["serving_version"] == served and (root / "LATEST").read_text().strip() == served
    assert json.loads((root / "verdicts" / f"{model['version']}.json").read_text())["status"] == "rejected"
    assert (tiny_config.parent / "reports" / "summary.json").read_text() == summary


TRANSACTIONS = dg.AssetKey(["extracts", "transactions"])
CACHE = dg.AssetKey("event_cache")


def _extracted(config: Path, instance: dg.DagsterInstance, day: str = "2023-01-02") -> None:
    """Every extract with its checks, as the nightly run leaves them (one day of transactions)."""
    assert _run(config, instance, [PRODUCTS, dg.AssetKey(["extracts", "demographics"])]).success
    assert _run(config, instance, [TRANSACTIONS], partition_key=day).success


def _cache_requests(defs: dg.Definitions, instance: dg.DagsterInstance, tick, n: int = 1):
    """(event_cache requests of n automation ticks, the last tick)."""
    requested = []
    for _ in range(n):
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        requested.append(tick.get_num_requested(CACHE))
    return requested, tick


def test_the_cache_waits_for_a_blocking_check_that_has_not_run_yet(tiny_config: Path) -> None:
    """Automation ticks between an extract's materialization and its blocking check's execution, in the same
    run (the check's step is held while they are evaluated), request no cache; it is requested once the
    check passed."""
    defs = build_definitions(str(tiny_config), env="ci")
    schema_check = dg.AssetCheckKey(TRANSACTIONS, "schema_unchanged")
    with dg.instance_for_test() as instance:
        _extracted(tiny_config, instance)
        state = {"tick": dg.evaluate_automation_conditions(defs=defs, instance=instance), "held": []}

        @dg.asset_check(asset=TRANSACTIONS, name="schema_unchanged", blocking=True)
        def held_schema_check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
            # the day is materialized, this check has not reported yet: the automation ticks now
            state["held"], state["tick"] = _cache_requests(defs, context.instance, state["tick"], n=2)
            return dg.AssetCheckResult(passed=state["verdict"])

        checks = [c for c in build_checks(str(tiny_config)) if schema_check not in c.check_keys]
        for day, verdict in (("2023-01-03", False), ("2023-01-04", True)):
            state["verdict"] = verdict
            result = dg.materialize(
                [*build_assets(str(tiny_config)), *checks, held_schema_check],
                instance=instance,
                selection=[TRANSACTIONS],
                partition_key=day,
                resources=defs.resources,
                raise_on_error=False,
            )
            assert result.get_asset_materialization_events()  # the day was extracted before the ticks
            assert state["held"] == [0, 0]  # a check that has not run yet holds the cache
            requested, state["tick"] = _cache_requests(defs, instance, state["tick"], n=2)
            # a failed check holds it after the run; a passed one lets the new day into the cache, once
            assert requested == ([0, 0] if not verdict else [1, 0])


def test_the_cache_waits_for_an_extract_materialized_without_its_blocking_check(tiny_config: Path) -> None:
    """An extract materialized without executing its blocking check (a run that left it out) holds the cache
    until the check ran and passed; a check that fails holds it until the change is accepted."""
    defs = build_definitions(str(tiny_config), env="ci")
    schema_check = dg.AssetSelection.checks(dg.AssetCheckKey(TRANSACTIONS, "schema_unchanged"))
    with dg.instance_for_test() as instance:
        _extracted(tiny_config, instance)
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance)

        unchecked = dg.AssetSelection.assets(TRANSACTIONS).without_checks()
        assert _run(tiny_config, instance, unchecked, partition_key="2023-01-03").success
        requested, tick = _cache_requests(defs, instance, tick, n=2)
        assert requested == [0, 0]
        assert _check_results(_run(tiny_config, instance, schema_check))["schema_unchanged"].passed
        requested, tick = _cache_requests(defs, instance, tick, n=2)
        assert requested == [1, 0]  # once

        _retype_manufacturer_id(tiny_config)
        assert _run(tiny_config, instance, dg.AssetSelection.assets(PRODUCTS).without_checks()).success
        requested, tick = _cache_requests(defs, instance, tick)
        assert requested == [0]  # not run yet
        products_check = dg.AssetSelection.checks(dg.AssetCheckKey(PRODUCTS, "schema_unchanged"))
        assert not _check_results(_run(tiny_config, instance, products_check))["schema_unchanged"].passed
        requested, tick = _cache_requests(defs, instance, tick)
        assert requested == [0]  # failed
        assert _accept_new_schema(tiny_config, instance).success
        requested, tick = _cache_requests(defs, instance, tick)
        assert requested == [1]


def test_extracts_never_checked_and_missing_days_do_not_hold_the_cache(tiny_config: Path) -> None:
    """Materializations made before the checks existed (no evaluation at all) and day partitions without data
    (never materialized) do not hold the cache back: only updates whose blocking checks have not passed do."""
    defs = build_definitions(str(tiny_config), env="ci")
    with dg.instance_for_test() as instance:
        for key in (PRODUCTS, dg.AssetKey(["extracts", "demographics"])):
            assert _run(tiny_config, instance, dg.AssetSelection.assets(key).without_checks()).success
        day = dg.AssetSelection.assets(TRANSACTIONS).without_checks()
        assert _run(tiny_config, instance, day, partition_key="2023-01-02").success
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance)

        assert _run(tiny_config, instance, [TRANSACTIONS], partition_key="2023-01-03").success
        requested, _ = _cache_requests(defs, instance, tick)
        assert requested == [1]
