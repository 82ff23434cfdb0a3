"""Inputs that are readable but not what the user meant: a source's path matching two copies of one file,
files of one source disagreeing on a column's type. Each is one line naming the files and what to do, before
anything is written; what cannot be told from a mistake is accepted without a word."""

from __future__ import annotations

import shutil
from pathlib import Path

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
