"""Config loading and config-vs-data checks: good configs pass, each class of mistake names its YAML path."""

from __future__ import annotations

import datetime as dt
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline.config import load_config, parse_config
from basemodel_pipeline.demo.datasets import DEMO_CONFIG
from basemodel_pipeline.errors import ConfigError, UserError
from basemodel_pipeline.sources.data_checks import check_config_against_data, source_columns
from basemodel_pipeline.sources.parquet import read_parquet_sql

FAKE = Path("/configs/demo/config.yaml")
Mutation = Callable[[dict[str, Any]], None]


def demo_with(mutate: Mutation) -> str:
    raw = yaml.safe_load(DEMO_CONFIG)
    mutate(raw)
    return yaml.safe_dump(raw, sort_keys=False)


def edit_config(config: Path, mutate: Mutation) -> Path:
    raw = yaml.safe_load(config.read_text())
    mutate(raw)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def data_error(config: Path) -> str:
    with pytest.raises(ConfigError) as info:
        check_config_against_data(load_config(config), config)
    return str(info.value)


def events(raw: dict[str, Any]) -> dict[str, Any]:
    return raw["data_sources"][0]


# --- good configs ---------------------------------------------------------------------------------------


def test_demo_config_parses() -> None:
    cfg = parse_config(DEMO_CONFIG, FAKE)
    assert [s.name for s in cfg.data_sources] == ["transactions", "products", "demographics"]
    assert cfg.source("products").data_location.path == "/configs/demo/data/products.parquet"
    assert cfg.workspace == "/configs/demo"
    assert [s.name for s in cfg.scenarios] == ["churn", "department_propensity"]
    assert cfg.data_params.training_end_date == "-47d"  # rolling: resolved against the data at each run
    assert cfg.data_params.resolved(dt.date(2018, 1, 1), 28).test_date == dt.date(2017, 11, 15)


def test_tiny_config_loads_and_matches_its_data(tiny_dataset: Path) -> None:
    cfg = load_config(tiny_dataset)
    check_config_against_data(cfg, tiny_dataset)
    # same sources, joins and scenarios as the demo; only dates and sizes differ
    demo = parse_config(DEMO_CONFIG, tiny_dataset)
    assert cfg.data_sources == demo.data_sources
    assert [(s.name, s.target.horizon_days) for s in cfg.scenarios] == [
        ("churn", 28),
        ("department_propensity", 14),
    ]
    dp = cfg.data_params
    assert (dp.data_start_date, dp.first_split) == (dt.date(2023, 1, 1), dt.date(2023, 1, 29))
    assert (dp.validation_start_date, dp.training_end_date) == (dt.date(2023, 3, 2), dt.date(2023, 3, 30))
    last_day = pq.read_table(cfg.source("transactions").data_location.path)["transaction_timestamp"]
    assert dp.training_end_date + dt.timedelta(days=28) <= max(last_day.to_pylist()).date()
    assert cfg.training_params.foundation.hidden_dim == 32


def test_tiny_dataset_is_deterministic(tmp_path: Path, tiny_dataset: Path) -> None:
    from basemodel_pipeline.demo.synthetic import write_tiny_dataset

    again = write_tiny_dataset(tmp_path)
    for name in ("transactions", "products", "demographics"):
        a = pq.read_table(tiny_dataset.parent / "data" / f"{name}.parquet")
        assert a.equals(pq.read_table(again.parent / "data" / f"{name}.parquet"))
    assert again.read_text() == tiny_dataset.read_text()


def test_read_parquet_sql_quotes_and_globs(tmp_path: Path) -> None:
    odd = tmp_path / "it's data"
    odd.mkdir()
    assert (
        read_parquet_sql(str(odd))
        == f"read_parquet('{tmp_path}/it''s data/**/*.parquet', union_by_name=true)"
    )
    assert read_parquet_sql("s3://b/x/*.parquet") == "read_parquet('s3://b/x/*.parquet', union_by_name=true)"
    (odd / "day=1").mkdir()
    pq.write_table(pa.table({"user id": [1], "when": ["2023-01-01"]}), odd / "day=1" / "part.parquet")
    cfg = parse_config(
        f'data_sources: [{{type: event, name: ev, data_location: {{database_type: parquet, path: "{odd}"}},'
        " main_entity_column: user id, date_column: {name: when, format: '%Y-%m-%d'}}]\n"
        "data_params: {data_start_date: 2023-01-01, validation_start_date: 2023-03-01, "
        "training_end_date: 2023-04-01}\n",
        tmp_path / "c.yaml",
    )
    # hive-style directories (day=1) become columns, as DuckDB reads them
    assert source_columns(cfg.data_sources[0]) == {"user id": "BIGINT", "when": "VARCHAR", "day": "BIGINT"}
    check_config_against_data(cfg)  # a column with a space in its name is quoted safely


# --- mistakes in the YAML itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(
            lambda c: c["data_params"].update(split_interval_day=7),
            ["data_params.split_interval_day: unknown key 'split_interval_day'"],
            id="unknown-key",
        ),
        pytest.param(
            lambda c: c["training_params"]["foundation"].update(epochs="many"),
            ["training_params.foundation.epochs: Input should be a valid integer", "(got 'many')"],
            id="wrong-type",
        ),
        pytest.param(
            lambda c: c["data_params"].pop("training_end_date"),
            ["data_params.training_end_date: required field is missing"],
            id="missing-field",
        ),
        pytest.param(
            lambda c: events(c).update(disallowed_columns=["basket_id"]),
            ["data_sources[0]: set allowed_columns or disallowed_columns, not both"],
            id="allowed-and-disallowed",
        ),
        pytest.param(
            lambda c: events(c)["joined_data_sources"][0].update(name="product"),
            [
                "data_sources[0].joined_data_sources[0].name: 'product' is not an attribute data source",
                "(known attribute sources: products)",
            ],
            id="unknown-joined-source",
        ),
        pytest.param(
            lambda c: c["scenarios"][0]["target"].update(source="products"),
            ["scenarios[0].target.source: 'products' is not an event data source (known: transactions)"],
            id="scenario-source-not-event",
        ),
        pytest.param(
            lambda c: c["data_params"].update(
                training_start_date="2017-03-01",
                validation_start_date="2017-12-01",
                training_end_date="2017-11-15",
            ),
            ["data_params: validation_start_date (2017-12-01) must be before training_end_date (2017-11-15)"],
            id="dates-out-of-order",
        ),
        pytest.param(
            lambda c: c["data_sources"][1].update(type="evnt"),
            [
                "data_sources[1].type: Input should be 'event', 'main_entity_attribute' or 'attribute'",
                "'evnt'",
            ],
            id="bad-enum",
        ),
    ],
)
def test_bad_yaml_names_the_path(mutate: Mutation, expected: list[str]) -> None:
    text = demo_with(mutate)
    with pytest.raises(ConfigError) as info:
        parse_config(text, FAKE)
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert re.match(rf"{FAKE}:\d+: ", message), message
    for part in expected:
        assert part in message


def test_errors_point_at_the_offending_line() -> None:
    text = demo_with(lambda c: events(c)["joined_data_sources"][0].update(name="product"))
    line = next(n for n, t in enumerate(text.splitlines(), 1) if t.strip() == "- name: product")
    with pytest.raises(
        ConfigError, match=rf"^{FAKE}:{line}: data_sources\[0\]\.joined_data_sources\[0\]\.name: "
    ):
        parse_config(text, FAKE)


def test_invalid_yaml_reports_the_line() -> None:
    lines = DEMO_CONFIG.splitlines()
    bad = next(n for n, t in enumerate(lines) if "main_entity_column: household_id" in t)
    lines[bad] += ": oops"
    with pytest.raises(
        ConfigError, match=rf"^{FAKE}:{bad + 1}: not valid YAML: mapping values are not allowed"
    ):
        parse_config("\n".join(lines), FAKE)


ENV_PATH = "data_sources[1].data_location.path"


def with_env_path(path: str) -> str:
    return demo_with(lambda c: c["data_sources"][1]["data_location"].update(path=path))


def test_env_var_is_interpolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BM_TEST_DATA", "/mnt/shared")
    cfg = parse_config(with_env_path("${BM_TEST_DATA}/products.parquet"), FAKE)
    assert cfg.source("products").data_location.path == "/mnt/shared/products.parquet"


def test_unset_env_var_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BM_TEST_DATA", raising=False)
    with pytest.raises(ConfigError) as info:
        parse_config(with_env_path("${BM_TEST_DATA}/products.parquet"), FAKE)
    assert f"{ENV_PATH}: environment variable BM_TEST_DATA is not set" in str(info.value)
    assert "${BM_TEST_DATA:-default}" in str(info.value)


@pytest.mark.parametrize(("value", "expected"), [(None, "/srv/fallback"), ("/mnt/set", "/mnt/set")])
def test_env_var_default(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str) -> None:
    if value is None:
        monkeypatch.delenv("BM_TEST_DATA", raising=False)
    else:
        monkeypatch.setenv("BM_TEST_DATA", value)
    cfg = parse_config(with_env_path("${BM_TEST_DATA:-/srv/fallback}/products.parquet"), FAKE)
    assert cfg.source("products").data_location.path == f"{expected}/products.parquet"


# --- YAML anchors and aliases: a few are fine, an alias bomb is refused quickly --------------------------

BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
    ]
)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail the test (instead of hanging) when the block runs longer than `seconds`."""

    def expired(*_: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("where", ["top level", "inside a section"])
def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path, where: str) -> None:
    assert len(BOMB) < 500
    indented = "".join(f"  {line}\n" for line in BOMB.splitlines())
    text = BOMB if where == "top level" else f"{DEMO_CONFIG}\nx_bomb:\n{indented}"
    config = tmp_path / "bomb.yaml"
    config.write_text(text)
    started = time.perf_counter()
    with deadline(10), pytest.raises(ConfigError) as info:
        load_config(config)
    assert time.perf_counter() - started < 2
    message = str(info.value)
    assert "\n" not in message and str(config) in message and "alias" in message, message


def test_a_recursive_alias_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "loop.yaml"
    config.write_text(DEMO_CONFIG + "\nx_loop: &loop [1, *loop]\n")
    with deadline(10), pytest.raises(ConfigError) as info:
        load_config(config)
    assert str(config) in str(info.value) and "alias" in str(info.value)


def test_a_few_anchors_and_aliases_still_load(tmp_path: Path) -> None:
    text = DEMO_CONFIG.replace("horizon_days: 28\n    epochs: 4", "horizon_days: &horizon 28\n    epochs: 4")
    text = text.replace("event: none, horizon_days: 28", "event: none, horizon_days: *horizon")
    text = text.replace(
        "  - type: attribute\n    name: products\n    data_location: {database_type: parquet,",
        "  - type: attribute\n    name: products\n    data_location: &loc {database_type: parquet,",
    )
    text = text.replace(
        "data_location: {database_type: parquet, path: data/demographics.parquet}",
        "data_location: {<<: *loc, path: data/demographics.parquet}",
    )
    assert "*horizon" in text and "<<: *loc" in text
    config = tmp_path / "config.yaml"
    config.write_text(text)
    cfg = load_config(config)
    assert cfg.training_params.foundation.horizon_days == 28
    assert cfg.scenarios[0].target.horizon_days == 28
    assert cfg.source("demographics").data_location.path.endswith("data/demographics.parquet")


# --- config does not fit the data -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "where", "column"),
    [
        (
            lambda c: events(c).update(main_entity_column="household"),
            "data_sources[0].main_entity_column",
            "household",
        ),
        (
            lambda c: events(c)["date_column"].update(name="timestamp"),
            "data_sources[0].date_column.name",
            "timestamp",
        ),
        (
            lambda c: events(c)["allowed_columns"].__setitem__(1, "product"),
            "data_sources[0].allowed_columns[1]",
            "product",
        ),
        (
            lambda c: c["data_sources"][2].update(disallowed_columns=["income", "Age"]),
            "data_sources[2].disallowed_columns[1]",
            "Age",
        ),
        (
            lambda c: events(c).update(column_types={"store": "categorical"}),
            "data_sources[0].column_types.store",
            "store",
        ),
        (
            lambda c: events(c)["joined_data_sources"][0].update(join_on={"productid": "product_id"}),
            "data_sources[0].joined_data_sources[0].join_on.productid",
            "productid",
        ),
        (
            lambda c: events(c)["joined_data_sources"][0].update(join_on={"product_id": "prod_id"}),
            "data_sources[0].joined_data_sources[0].join_on.product_id",
            "prod_id",
        ),
        (
            lambda c: c["scenarios"][1]["target"].update(column="departmnt"),
            "scenarios[1].target.column",
            "departmnt",
        ),
    ],
    ids=[
        "entity",
        "date",
        "allowed",
        "disallowed",
        "column-types",
        "join-left",
        "join-right",
        "target-column",
    ],
)
def test_column_missing_from_data(tiny_config: Path, mutate: Mutation, where: str, column: str) -> None:
    message = data_error(edit_config(tiny_config, mutate))
    assert re.match(
        rf"{re.escape(str(tiny_config))}:\d+: {re.escape(where)}: column '{column}' is not in", message
    )
    assert ".parquet" in message and "available columns: " in message and "Fix the name" in message


def test_missing_column_lists_available_columns_and_suggests(tiny_config: Path) -> None:
    message = data_error(edit_config(tiny_config, lambda c: events(c).update(main_entity_column="household")))
    assert f"data source 'transactions' ({tiny_config.parent}/data/transactions.parquet)" in message
    assert "did you mean 'household_id'?" in message
    assert (
        "available columns: household_id, store_id, basket_id, product_id, quantity, sales_value" in message
    )


def test_target_column_may_come_from_a_joined_source(tiny_config: Path) -> None:
    edit_config(tiny_config, lambda c: c["scenarios"][1]["target"].update(column="product_category"))
    check_config_against_data(load_config(tiny_config), tiny_config)


def write_events(config: Path, timestamps: pa.Array) -> None:
    data = config.parent / "data" / "transactions.parquet"
    table = pq.read_table(data).slice(0, len(timestamps))
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("transaction_timestamp"), "transaction_timestamp", timestamps
        ),
        data,
    )


def test_text_dates_with_format_pass(tiny_config: Path) -> None:
    write_events(tiny_config, pa.array(["2023-01-05 10:00:00", None, "2023-01-06 11:30:00"]))
    edit_config(tiny_config, lambda c: events(c)["date_column"].update(format="%Y-%m-%d %H:%M:%S"))
    edit_config(tiny_config, lambda c: c.update(scenarios=[]))  # two days of data: no test window fits
    check_config_against_data(load_config(tiny_config), tiny_config)


def test_date_that_does_not_parse(tiny_config: Path) -> None:
    write_events(tiny_config, pa.array(["2023-01-05", "2023-01-06", "2023/01/07", "07.01.2023"]))
    edit_config(tiny_config, lambda c: events(c)["date_column"].update(format="%Y-%m-%d"))
    message = data_error(tiny_config)
    assert (
        "data_sources[0].date_column.format: value '2023/01/07' of column 'transaction_timestamp'" in message
    )
    assert f"at row 3 (counting from 1) of {tiny_config.parent}/data/transactions.parquet" in message
    assert "does not parse with format '%Y-%m-%d'" in message


@pytest.mark.parametrize(
    ("timestamps", "fmt", "expected"),
    [
        (
            pa.array(["2023-01-05"]),
            None,
            "data_sources[0].date_column.format: column 'transaction_timestamp' of data source "
            "'transactions' is text (VARCHAR); set date_column.format",
        ),
        (
            pa.array([dt.datetime(2023, 1, 5)], pa.timestamp("us")),
            "%Y-%m-%d",
            "data_sources[0].date_column.format: column 'transaction_timestamp' of data source "
            "'transactions' is already TIMESTAMP; remove format",
        ),
        (
            pa.array([20230105]),
            None,
            "data_sources[0].date_column.name: column 'transaction_timestamp' of data source "
            "'transactions' has type BIGINT; a date column must be DATE/TIMESTAMP",
        ),
        (
            pa.array(["2023-01-05"]),
            "%Q",
            "data_sources[0].date_column.format: '%Q' is not a valid strptime format",
        ),
    ],
    ids=["text-without-format", "timestamp-with-format", "integer", "bad-format"],
)
def test_date_column_type_and_format(
    tiny_config: Path, timestamps: pa.Array, fmt: str | None, expected: str
) -> None:
    write_events(tiny_config, timestamps)
    edit_config(tiny_config, lambda c: events(c)["date_column"].update(format=fmt))
    assert expected in data_error(tiny_config)


def test_date_type_column_needs_no_format(tiny_config: Path) -> None:
    write_events(tiny_config, pa.array([dt.date(2023, 1, 5), dt.date(2023, 1, 6)], pa.date32()))
    edit_config(tiny_config, lambda c: c.update(scenarios=[]))  # two days of data: no test window fits
    check_config_against_data(load_config(tiny_config), tiny_config)


def test_join_keys_that_never_match(tiny_config: Path) -> None:
    products = tiny_config.parent / "data" / "products.parquet"
    table = pq.read_table(products)
    ids = pa.array([f"P{i:04d}" for i in table["product_id"].to_pylist()])
    pq.write_table(table.set_column(0, "product_id", ids), products)
    message = data_error(tiny_config)
    assert message.startswith(f"{tiny_config}:")
    assert (
        "data_sources[0].joined_data_sources[0].join_on: no row of 'transactions' matches a row of 'products'"
        " on product_id = product_id" in message
    )
    assert re.search(r"e\.g\. transactions has \d+, \d+, \d+ but products has 'P\d{4}', 'P\d{4}'", message)
    assert "Make the IDs use the same format in both sources" in message


def test_join_keys_of_different_types_that_match_as_text_are_fine(tiny_config: Path) -> None:
    products = tiny_config.parent / "data" / "products.parquet"
    table = pq.read_table(products)
    ids = pa.array([str(i) for i in table["product_id"].to_pylist()])
    pq.write_table(table.set_column(0, "product_id", ids), products)
    check_config_against_data(load_config(tiny_config), tiny_config)


def test_main_entity_ids_that_never_match(tiny_config: Path) -> None:
    demographics = tiny_config.parent / "data" / "demographics.parquet"
    table = pq.read_table(demographics)
    ids = pa.array([f"H{i:03d}" for i in table["household_id"].to_pylist()])
    pq.write_table(table.set_column(0, "household_id", ids), demographics)
    message = data_error(tiny_config)
    assert (
        "data_sources[2].main_entity_column: no row of 'transactions' matches a row of 'demographics'"
        " on household_id = household_id" in message
    )
    assert re.search(r"but demographics has 'H\d{3}'", message), message


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("quantity >", "'quantity >' is not valid SQL (column 10): Required keyword: 'expression' missing"),
        ("quantity > 0; DROP TABLE x", "'quantity > 0; DROP TABLE x' must be one boolean expression on the"),
        ("quantity > (SELECT 1)", "'quantity > (SELECT 1)' must be one boolean expression"),
        ("quantiti > 0", "DuckDB cannot run 'quantiti > 0' on 'transactions': Binder Error"),
        ("quantity < 0", "'quantity < 0' keeps no rows of data source 'transactions'"),
    ],
    ids=["does-not-parse", "two-statements", "subquery", "unknown-column", "keeps-nothing"],
)
def test_bad_where_condition(tiny_config: Path, condition: str, expected: str) -> None:
    message = data_error(edit_config(tiny_config, lambda c: events(c).update(where_condition=condition)))
    assert f"data_sources[0].where_condition: {expected}" in message
    assert "\n" not in message


def test_where_condition_on_quoted_column(tiny_config: Path) -> None:
    edit_config(
        tiny_config, lambda c: events(c).update(where_condition='"sales_value" > 0 AND store_id IN (1, 2)')
    )
    check_config_against_data(load_config(tiny_config), tiny_config)


@pytest.mark.parametrize("path", ["data/missing.parquet", "data/nothing/*.parquet", "empty_dir"])
def test_data_path_matching_nothing(tiny_config: Path, path: str) -> None:
    (tiny_config.parent / "empty_dir").mkdir()
    message = data_error(
        edit_config(tiny_config, lambda c: c["data_sources"][1]["data_location"].update(path=path))
    )
    assert "data_sources[1].data_location.path: data source 'products': cannot read Parquet at" in message
    assert "No files found that match the pattern" in message
    assert "check data_location.path (relative paths are relative to the config file)" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e308])
def test_validate_names_non_finite_amounts(tiny_config: Path, bad: float) -> None:
    """NaN, +-inf or 1e308 amounts used to pass validate and end pretraining in a non-finite loss."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    values = table.column("sales_value").to_pylist()
    values[5] = bad
    pq.write_table(
        table.set_column(table.schema.get_field_index("sales_value"), "sales_value", pa.array(values)), path
    )
    with pytest.raises(
        ConfigError, match=r"sales_value.*1 values of column 'sales_value' .* NaN, infinite or beyond float32"
    ):
        check_config_against_data(load_config(tiny_config), tiny_config)


def _retype_ids(path: Path, fmt: str, every: int = 1) -> None:
    """Rewrite a source's household_id as text: every `every`-th id in format `fmt` (e.g. '{:06d}'), the
    others as plain integer text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    ids = [(fmt if v % every == 0 else "{}").format(v) for v in table.column("household_id").to_pylist()]
    column = table.schema.get_field_index("household_id")
    pq.write_table(table.set_column(column, "household_id", pa.array(ids)), path)


@pytest.mark.parametrize("fmt", ["{:06d}", "H{}", "{}.0"])
def test_validate_refuses_entity_ids_that_are_integers_in_one_source_and_other_text_in_another(
    tiny_config: Path, fmt: str
) -> None:
    """household_id is BIGINT in transactions; as text in demographics with some ids written '000042', 'H42'
    or '42.0' (the others match, so the join check passes), those rows would match by accident of a cast,
    or not at all, in the cache: one line naming both sources and columns, their types and an example."""
    _retype_ids(tiny_config.parent / "data" / "demographics.parquet", fmt, every=3)
    with pytest.raises(ConfigError) as err:
        check_config_against_data(load_config(tiny_config), tiny_config)
    line = str(err.value)
    assert "\n" not in line and "data_sources[2].main_entity_column" in line
    for needle in ("'transactions'", "'demographics'", "household_id", "BIGINT", "VARCHAR", fmt.format(3)):
        assert needle in line, (needle, line)


def test_entity_ids_as_plain_integer_text_match_integers(tiny_config: Path) -> None:
    """The documented coercion: ids written as plain integer text ('42') match the integer 42."""
    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.pipeline import run_cache, run_extract
    from basemodel_pipeline.workspace import cache_dir

    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    with EventCache(cache_dir(cfg)) as cache:
        expected = {k: v.copy() for k, v in cache.attributes.items()}
    _retype_ids(tiny_config.parent / "data" / "demographics.parquet", "{}")
    check_config_against_data(cfg, tiny_config)
    run_extract(cfg, "demographics")
    run_cache(cfg)
    with EventCache(cache_dir(cfg)) as cache:
        assert cache.entity_ids.dtype.kind == "i"
        assert {k: v.tolist() for k, v in cache.attributes.items()} == {
            k: v.tolist() for k, v in expected.items()
        }


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("training_params", "foundation", "num_blocks"), 10**30),
        (("scenarios", 0, "target", "horizon_days"), 10**19),
        (("training_params", "finetune", "patience"), -(10**19)),
    ],
)
def test_integers_beyond_any_sensible_size_are_one_config_error(
    tiny_config: Path, path: tuple, value: int
) -> None:
    """Found by the fuzz test: 10**30 ended in an OverflowError traceback, 10**19 passed `validate`."""
    cfg = yaml.safe_load(tiny_config.read_text())
    node = cfg
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    tiny_config.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=rf"{path[-1]}.*{value}.*too large") as err:
        load_config(tiny_config)
    assert "\n" not in str(err.value)


def test_null_entity_ids_and_dates_are_named_by_validate(tiny_config: Path) -> None:
    """Found by the fuzz test: null ids, or no timestamp at all, in an event source passed `validate` (a few
    missing dates stay missing values: test_text_dates_with_format_pass)."""
    path = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    for column, rows in (("household_id", [3, 7]), ("transaction_timestamp", range(table.num_rows))):
        values = table.column(column).to_pylist()
        for r in rows:
            values[r] = None
        n = len(rows) if column == "household_id" else r"\d+"  # rows kept by where_condition
        broken = table.set_column(
            table.schema.get_field_index(column), column, pa.array(values, table[column].type)
        )
        pq.write_table(broken, path)
        with pytest.raises(UserError, match=rf"{n} rows of data source 'transactions' .* no {column}") as err:
            check_config_against_data(load_config(tiny_config), tiny_config)
        assert "where_condition" in str(err.value) and "\n" not in str(err.value)
    pq.write_table(table, path)


def test_a_training_end_date_counted_back_from_the_data_leaves_room_for_the_longest_horizon() -> None:
    """`training_end_date: -47d`: the test split point 47 days before the last event day, so several weekly
    test windows fit after it; an offset shorter than the longest horizon is refused naming the smallest one."""
    import datetime as dt

    from basemodel_pipeline.config.params import DataParams
    from basemodel_pipeline.errors import ConfigError

    dp = DataParams.model_validate(
        {
            "data_start_date": "2017-01-01",
            "training_start_date": "-37w",
            "validation_start_date": "-6w",
            "training_end_date": "-47d",
        }
    )
    assert dp.rolling
    resolved = dp.resolved(dt.date(2018, 1, 1), longest_horizon_days=28)
    assert (resolved.first_split, resolved.validation_start, resolved.test_date) == (
        dt.date(2017, 3, 1),
        dt.date(2017, 10, 4),
        dt.date(2017, 11, 15),
    )
    short = dp.model_copy(update={"training_end_date": "-3w"})
    with pytest.raises(ConfigError, match=r"training_end_date: -3w .* 28 days.* -28d or more"):
        short.resolved(dt.date(2018, 1, 1), longest_horizon_days=28)
