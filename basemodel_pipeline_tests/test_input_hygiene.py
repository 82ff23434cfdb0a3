"""Inputs that are readable but not what the user meant: a source's path matching two copies of one file,
files of one source disagreeing on a column's type. Each is one line naming the files and what to do, before
anything is written; what cannot be told from a mistake is accepted without a word."""

from __future__ import annotations

import shutil
from pathlib import Path

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
    assert "warning" not in result.output and "error" not in result.output
    extracted = pq.read_table(tiny_config.parent / "extracts" / "transactions")
    assert pa.types.is_integer(extracted.schema.field("quantity").type)
    assert pa.types.is_floating(extracted.schema.field("retail_disc").type)

