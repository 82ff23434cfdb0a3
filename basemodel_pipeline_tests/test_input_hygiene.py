"""Inputs that are readable but not what the user meant: a source's path matching two copies of one file,
files of one source disagreeing on a column's type. Each is one line naming the files and what to do, before
anything is written; what cannot be told from a mistake is accepted without a word."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline_tests.test_damaged_files import _one_line_error, split_source

runner = CliRunner()


def test_a_copy_of_a_source_file_is_refused_naming_both_files(tiny_config: Path) -> None:
    _, part = split_source(tiny_config)
    copy = part.with_name("part-1 (1).parquet")  # what a browser or a file manager names a second download
    shutil.copy(part, copy)
    for command in ("validate", "extract"):
        line = _one_line_error(
            [command, str(tiny_config)], str(part), str(copy), "same content", "remove one"
        )
        assert "part-0" not in line
    assert not list((tiny_config.parent / "extracts" / "transactions").glob("*.parquet"))
    copy.unlink()
    assert runner.invoke(app, ["extract", str(tiny_config)]).exit_code == 0


def test_files_of_equal_size_are_told_apart_by_their_content(tmp_path: Path) -> None:
    from basemodel_pipeline.sources.source_files import identical_files

    a, b, c = (tmp_path / f"{name}.parquet" for name in "abc")
    a.write_bytes(b"x" * 4096)
    b.write_bytes(b"x" * 4095 + b"y")  # the same size, another content
    c.write_bytes(b"x" * 100)
    assert identical_files([a, b, c]) is None
    shutil.copy(b, tmp_path / "d.parquet")
    assert identical_files([a, b, c, tmp_path / "d.parquet"]) == (b, tmp_path / "d.parquet")


def retype(path: Path, column: str, dtype: pa.DataType) -> None:
    """Rewrite one file of a source with `column` cast to `dtype` (as another writer would have typed it; floats cut to integers)."""
    table = pq.read_table(path)
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, column, pc.cast(table.column(column), dtype, safe=False)), path)


@pytest.mark.parametrize(
    ("column", "dtype", "kinds"),
    [
        ("sales_value", pa.string(), ("double", "string")),
        ("transaction_timestamp", pa.string(), ("timestamp[us]", "string")),
        ("household_id", pa.string(), ("int64", "string")),
    ],
)
def test_files_disagreeing_on_a_columns_type_are_refused_naming_both(
    tiny_config: Path, column: str, dtype: pa.DataType, kinds: tuple[str, str]
) -> None:
    first, odd = split_source(tiny_config)
    retype(odd, column, dtype)
    for command in ("validate", "extract"):
        line = _one_line_error([command, str(tiny_config)], f"column {column}", str(first), str(odd), *kinds)
        assert "transactions" in line
    assert not list((tiny_config.parent / "extracts" / "transactions").glob("*.parquet"))


def test_types_that_widen_safely_and_unused_columns_pass_without_a_word(tiny_config: Path) -> None:
    _, odd = split_source(tiny_config)
    retype(odd, "quantity", pa.int32())  # int32 beside int64
    retype(odd, "sales_value", pa.float32())  # float beside double
    retype(odd, "retail_disc", pa.int64())  # integers beside floats (whole-number discounts)
    retype(odd, "basket_id", pa.string())  # text beside int64, in a column the config does not select
    result = runner.invoke(app, ["extract", str(tiny_config)])
    assert result.exit_code == 0, (result.output, result.exception)
    text = " ".join(result.output.split())  # the console wraps long lines
    assert "error" not in text and text.count("warning:") == text.count("repeat another row"), (
        text
    )  # the data's own
    extracted = pq.read_table(tiny_config.parent / "extracts" / "transactions")
    assert pa.types.is_integer(extracted.schema.field("quantity").type)
    assert pa.types.is_floating(extracted.schema.field("retail_disc").type)


EXTRACTED = [  # the columns of the tiny config's transactions extract (basket_id is not selected)
    "household_id",
    "transaction_timestamp",
    "store_id",
    "product_id",
    "quantity",
    "sales_value",
    "retail_disc",
    "coupon_disc",
]


def repeated_rows(source: Path) -> int:
    """Rows of the tiny source's extract equal in every column to another one, counted by DuckDB's DISTINCT."""
    kept = f"FROM read_parquet('{source}') WHERE quantity > 0"  # the config's where_condition
    distinct = f"SELECT count(*) FROM (SELECT DISTINCT {', '.join(EXTRACTED)} {kept})"
    return duckdb.execute(f"SELECT count(*) - ({distinct}) {kept}").fetchone()[0]


def test_repeated_rows_are_kept_and_reported_with_a_count_and_an_example(tiny_config: Path) -> None:
    from basemodel_pipeline.config import load_config
    from basemodel_pipeline.pipeline import run_extract

    source = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(source)
    copies = table.filter(pc.greater(table["quantity"], 0)).slice(100, 7)  # a batch loaded twice
    pq.write_table(pa.concat_tables([table, copies]), source)
    expected = repeated_rows(source)
    assert expected >= 7
    result = runner.invoke(app, ["extract", str(tiny_config)])
    assert result.exit_code == 0, (result.output, result.exception)
    text = " ".join(result.output.split())  # the console wraps long lines
    assert text.count("repeat another row") == 1, result.output
    line = text[text.index("warning: source 'transactions'") :].split(" extract ")[0]
    assert f" {expected} rows repeat another row in every column" in line and "e.g. household_id=" in line
    meta = run_extract(load_config(tiny_config), "transactions")["transactions"]
    assert meta["duplicate_rows"] == expected
    kept = duckdb.execute(f"SELECT count(*) FROM read_parquet('{source}') WHERE quantity > 0").fetchone()[0]
    assert meta["rows"] == kept  # every row kept


def test_a_source_without_repeated_rows_reports_none(tiny_config: Path) -> None:
    from basemodel_pipeline.config import load_config
    from basemodel_pipeline.pipeline import run_extract

    source = tiny_config.parent / "data" / "transactions.parquet"
    distinct = duckdb.execute(
        f"SELECT DISTINCT {', '.join(EXTRACTED)} FROM read_parquet('{source}')"
    ).fetch_arrow_table()
    pq.write_table(distinct, source)
    assert repeated_rows(source) == 0
    meta = run_extract(load_config(tiny_config), "transactions")["transactions"]
    assert meta["duplicate_rows"] == 0


def test_repeats_are_counted_in_every_column_nulls_and_nans_alike(tmp_path: Path) -> None:
    from basemodel_pipeline.sources.repeats import adjacent_repeats

    path = tmp_path / "day.parquet"
    table = pa.table(
        {
            "id": [1, 1, 1, 2, 2, 3, 3],
            "amount": [1.0, 1.0, 2.0, float("nan"), float("nan"), None, None],
            "tags": [["a"], ["a"], ["a"], [], [], ["b"], ["c"]],
        }
    )  # sorted by every column: rows 1 and 4 repeat the row before them; 6 differs from 5 in its tags only
    pq.write_table(table, path)
    assert adjacent_repeats(path) == (2, 1)
    pq.write_table(table.slice(5), path)
    assert adjacent_repeats(path) == (0, None)
