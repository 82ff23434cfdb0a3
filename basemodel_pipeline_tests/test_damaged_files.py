"""Damaged Parquet inputs (a truncated file, corrupt pages behind an intact footer) in a source, in an
extract of the workspace or in an --entities file: one line naming the file and what to do, never a
DuckDB/pyarrow traceback, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from basemodel_pipeline.cli import app

runner = CliRunner()


def _one_line_error(args: list[str], *needles: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]  # not progress bars
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stderr.strip().endswith(lines[0].strip()), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def truncate(path: Path) -> None:
    """Cut a file in half, as an interrupted copy leaves it (no footer, no magic bytes at the end)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def corrupt_pages(path: Path) -> None:
    """Flip bytes of the data pages and keep the footer intact: the schema reads, the rows do not."""
    data = bytearray(path.read_bytes())
    first = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    for i in range(first + 8, len(data) // 2, 5):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def split_source(config: Path) -> tuple[Path, Path]:
    """Make the transactions source a directory of two files (halves of the rows); returns them."""
    data = config.parent / "data"
    table = pq.read_table(data / "transactions.parquet")
    (data / "transactions.parquet").unlink()
    directory = data / "transactions"
    directory.mkdir()
    half = table.num_rows // 2
    a, b = directory / "part-0.parquet", directory / "part-1.parquet"
    pq.write_table(table.slice(0, half), a)
    pq.write_table(table.slice(half), b)
    config.write_text(config.read_text().replace("data/transactions.parquet", "data/transactions"))
    return a, b


@pytest.mark.parametrize("damage", [truncate, corrupt_pages])
def test_validate_names_a_damaged_source_file(tiny_config: Path, damage) -> None:
    _, bad = split_source(tiny_config)
    damage(bad)
    line = _one_line_error(["validate", str(tiny_config)], str(bad), "transactions", "corrupt")
    assert "part-0" not in line


@pytest.mark.parametrize("damage", [truncate, corrupt_pages])
def test_extract_names_a_damaged_source_file_and_writes_nothing(tiny_config: Path, damage) -> None:
    _, bad = split_source(tiny_config)
    damage(bad)
    _one_line_error(["extract", str(tiny_config)], str(bad), "transactions", "corrupt")
    extracts = tiny_config.parent / "extracts" / "transactions"
    assert not list(extracts.glob("*.parquet")), "a failed extract must not leave day files"


def test_cache_names_a_damaged_extract_and_the_command_to_redo_it(tiny_config: Path) -> None:
    assert runner.invoke(app, ["extract", str(tiny_config)]).exit_code == 0
    day = sorted((tiny_config.parent / "extracts" / "transactions").glob("*.parquet"))[10]
    corrupt_pages(day)
    _one_line_error(["cache", str(tiny_config)], str(day), "basemodel extract")
    assert not (tiny_config.parent / "cache").exists() or not any(
        p.name.endswith(".versions") for p in (tiny_config.parent / "cache").iterdir()
    )


def test_entities_file_that_is_not_parquet_is_one_line(tiny_config: Path, tmp_path: Path) -> None:
    from basemodel_pipeline.errors import UserError
    from basemodel_pipeline.inference.predict import read_entity_ids

    ids = tmp_path / "ids.parquet"
    ids.write_bytes(b"entity_id\n1\n2\n")
    with pytest.raises(UserError, match="ids.parquet") as err:
        read_entity_ids(ids)
    assert "\n" not in str(err.value) and "Parquet" in str(err.value)
