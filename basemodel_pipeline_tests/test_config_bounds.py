"""Hostile configs: size, nesting, values, string lengths, duplicate keys and where_condition are bounded, and each
violation is one `error:` line from the CLI naming the file, the field or line, and what to do."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline.cli import app
from basemodel_pipeline.config import loader
from basemodel_pipeline.config.base import MAX_NAME_CHARS, MAX_STRING_CHARS
from basemodel_pipeline.config.loader import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_VALUES
from basemodel_pipeline_tests.test_cli import _assert_user_error, runner


def _validate_fails(config: Path, *needles: str) -> str:
    """The one `error:` line of `basemodel validate CONFIG`, which names the file and each needle."""
    return _assert_user_error(["validate", str(config)], str(config), *needles)


def test_deep_nesting_is_one_line_naming_the_line(tiny_config: Path) -> None:
    """Before: 3,000 nested lists ended `validate` in a RecursionError traceback."""
    lines = tiny_config.read_text().count("\n")
    tiny_config.write_text(tiny_config.read_text() + "x_deep: " + "[" * 3000 + "]" * 3000 + "\n")
    _validate_fails(tiny_config, f":{lines + 1}:", f"more than {MAX_DEPTH} levels")


def test_nesting_up_to_the_limit_is_not_refused_for_its_depth(tiny_config: Path) -> None:
    tiny_config.write_text(
        tiny_config.read_text() + "x_deep: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    )
    _validate_fails(tiny_config, "unknown key 'x_deep'")  # refused as a stray key, not for its depth


@pytest.mark.parametrize(
    "old, new, key",
    [
        ("workspace: .\n", "workspace: .\nworkspace: /tmp/elsewhere\n", "workspace"),
        (
            "    path: data/products.parquet\n",
            "    path: data/products.parquet\n    path: x.parquet\n",
            "path",
        ),
        (
            "  split_interval_days: 7\n",
            "  split_interval_days: 7\n  split_interval_days: 14\n",
            "split_interval_days",
        ),
    ],
)
def test_a_duplicate_key_is_refused_naming_the_key_and_both_lines(
    tiny_config: Path, old: str, new: str, key: str
) -> None:
    """Before: the later value silently replaced the first."""
    text = tiny_config.read_text()
    first = text[: text.index(old) + len(old)].count("\n")
    tiny_config.write_text(text.replace(old, new, 1))
    _validate_fails(tiny_config, f":{first + 1}:", f"key '{key}'", f"line {first}")


def test_a_config_larger_than_the_limit_is_refused_before_it_is_parsed(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a 24 MB config was parsed for 4 minutes (1.7 GB) and accepted."""

    def no_parse(*args: object) -> None:
        raise AssertionError("an oversized config was parsed")

    monkeypatch.setattr(loader, "_parse_yaml", no_parse)
    padding = "# " + "x" * 1000 + "\n"
    tiny_config.write_text(tiny_config.read_text() + padding * (MAX_CONFIG_BYTES // len(padding) + 1))
    _validate_fails(tiny_config, f"at most {MAX_CONFIG_BYTES:,} bytes")


def test_a_config_with_too_many_values_is_refused_while_it_is_read(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half a megabyte of `[1,1,1,...]` took 12 s to compose: the values are counted while composing, so no
    more than the limit are built."""
    composed = []
    compose_node = loader.BoundedLoader.compose_node

    def counting(self: loader.BoundedLoader, parent: object, index: object) -> object:
        composed.append(1)
        return compose_node(self, parent, index)

    monkeypatch.setattr(loader.BoundedLoader, "compose_node", counting)
    tiny_config.write_text(tiny_config.read_text() + "x_many: [" + ",".join(["1"] * 200_000) + "]\n")
    assert tiny_config.stat().st_size < MAX_CONFIG_BYTES
    _validate_fails(tiny_config, f"more than {MAX_VALUES:,} values")
    assert len(composed) <= MAX_VALUES + 1


def _set(config: Path, path: tuple, value: object) -> None:
    raw = yaml.safe_load(config.read_text())
    node = raw
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    config.write_text(yaml.safe_dump(raw, sort_keys=False, width=1 << 30))


@pytest.mark.parametrize(
    "path, length, limit, field",
    [
        (("scenarios", 0, "name"), 1_000_000, MAX_NAME_CHARS, "scenarios[0].name"),
        (("data_sources", 0, "name"), 200, MAX_NAME_CHARS, "data_sources[0].name"),
        (
            ("data_sources", 0, "main_entity_column"),
            200,
            MAX_NAME_CHARS,
            "data_sources[0].main_entity_column",
        ),
        (
            ("data_sources", 0, "allowed_columns", 1),
            200,
            MAX_NAME_CHARS,
            "data_sources[0].allowed_columns[1]",
        ),
        (("data_sources", 0, "where_condition"), 20_000, MAX_STRING_CHARS, "data_sources[0].where_condition"),
        (("data_sources", 1, "data_location", "path"), 20_000, MAX_STRING_CHARS, "data_location.path"),
    ],
)
def test_an_overlong_string_is_one_line_naming_the_field_and_the_limit(
    tiny_config: Path, path: tuple, length: int, limit: int, field: str
) -> None:
    """Before: a 1,000,000-character scenario name was accepted. The message names the length and the
    limit, not the value."""
    _set(tiny_config, path, "q" * length)
    line = _validate_fails(tiny_config, field, f"{length:,} characters", f"at most {limit:,}")
    assert len(line) < 1000


def test_a_four_megabyte_where_condition_from_the_environment_is_refused(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a 4 MB where_condition kept `validate` busy for over 12 minutes."""
    monkeypatch.setenv("HUGE_WHERE", " AND ".join(["quantity > 0"] * 250_000))
    _set(tiny_config, ("data_sources", 0, "where_condition"), "${HUGE_WHERE}")
    _validate_fails(tiny_config, "data_sources[0].where_condition", f"at most {MAX_STRING_CHARS:,}")


def test_a_where_condition_nested_too_deeply_is_one_line(tiny_config: Path) -> None:
    """Before: 2,000 nested parentheses (4 KB) ended `validate` in a RecursionError traceback."""
    _set(tiny_config, ("data_sources", 0, "where_condition"), "(" * 2000 + "quantity > 0" + ")" * 2000)
    _validate_fails(tiny_config, "data_sources[0].where_condition", "nested")


def test_the_data_checks_use_where_condition_parsed_not_pasted(tiny_config: Path) -> None:
    """A trailing SQL comment in where_condition ended `validate` in a DuckDB ParserException traceback: the
    null-id check pasted the text into its query. Parsed, the comment is dropped and the condition still
    excludes the rows without an id."""
    path = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    ids = table.column("household_id").to_pylist()
    ids[3] = ids[7] = None
    pq.write_table(
        table.set_column(table.schema.get_field_index("household_id"), "household_id", pa.array(ids)), path
    )
    _set(
        tiny_config,
        ("data_sources", 0, "where_condition"),
        "quantity > 0 AND household_id IS NOT NULL -- rows without an id are not ours",
    )
    result = runner.invoke(app, ["validate", str(tiny_config)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "field, value",
    [
        ("data_start_date", "1800-01-01"),
        ("training_end_date", "9999-12-31"),
        ("validation_start_date", "2262-05-01"),
    ],
)
def test_dates_outside_what_timestamps_can_hold_are_one_line(
    tiny_config: Path, field: str, value: str
) -> None:
    """Before: training_end_date 9999-12-31 ended `validate` in an OverflowError traceback. Config dates lie in
    [1900-01-01, 2262-04-11): nanosecond timestamps end on 2262-04-11."""
    text = tiny_config.read_text()
    old = next(line for line in text.splitlines() if line.startswith(f"  {field}:"))
    tiny_config.write_text(text.replace(old, f"  {field}: {value}"))
    _validate_fails(tiny_config, f"data_params.{field}", value, "1900-01-01", "2262-04-11")


def test_the_finite_check_applies_where_condition_as_its_message_advises(tiny_config: Path) -> None:
    """A NaN amount in a row that where_condition excludes (quantity 0 with `quantity > 0`) failed `validate`,
    whose message says to exclude such rows with where_condition: the finite check read every row."""
    path = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    row = table.column("quantity").to_pylist().index(0)
    values = table.column("sales_value").to_pylist()
    values[row] = float("nan")
    column = table.schema.get_field_index("sales_value")
    pq.write_table(table.set_column(column, "sales_value", pa.array(values)), path)
    result = runner.invoke(app, ["validate", str(tiny_config)])
    assert result.exit_code == 0, result.output
