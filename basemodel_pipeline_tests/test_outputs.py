"""Output writers to local files (Parquet, CSV, TSV) and the `outputs:` config section."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from test_sources_support import edit_config

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import ConfigError, UserError
from basemodel_pipeline.outputs import open_writer, write_parquet_parts, write_table

AS_OF = dt.date(2024, 3, 1)


def predictions(n: int, seed: int = 0, start: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "entity_id": np.arange(start, start + n, dtype=np.int64),
            "as_of": pa.array([AS_OF] * n, pa.date32()),
            "score": rng.random(n).astype(np.float32),
        }
    )


def chunks(table: pa.Table, size: int) -> list[pa.Table]:
    return [table.slice(a, size) for a in range(0, table.num_rows, size)]


def read(path: str, fmt: str) -> pa.Table:
    if fmt == "parquet":
        return pq.read_table(path)
    delimiter = "\t" if fmt == "tsv" else ","
    return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter))


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv"])
def test_files_roundtrip_rerun_and_abort(tiny_config: Path, fmt: str) -> None:
    cfg = load_config(tiny_config)
    table = predictions(1000)
    info = write_table(open_writer(cfg, "predictions", "churn", AS_OF, fmt), chunks(table, 300))
    expected = Path(cfg.workspace) / "predictions" / "churn" / "2024-03-01" / f"predictions.{fmt}"
    assert info == {
        "rows": 1000,
        "format": fmt,
        "output": fmt,
        "destination": str(expected),
        "path": str(expected),
    }
    got = read(info["path"], fmt)
    assert got.column_names == ["entity_id", "as_of", "score"]
    assert got.column("entity_id").to_pylist() == list(range(1000))
    assert np.allclose(got.column("score").to_numpy(), table.column("score").to_numpy())
    assert got.column("as_of").cast(pa.date32()).to_pylist() == [AS_OF] * 1000

    # a re-run replaces the file: same rows, no duplicates
    rerun = predictions(800, seed=1)
    assert write_table(open_writer(cfg, "predictions", "churn", AS_OF, fmt), [rerun])["rows"] == 800
    again = read(info["path"], fmt)
    assert again.num_rows == 800 and np.allclose(again.column("score").to_numpy(), rerun.column("score"))

    # an aborted run leaves the published file as it was and no staging directory behind
    writer = open_writer(cfg, "predictions", "churn", AS_OF, fmt)
    writer.write(predictions(10, seed=2))
    writer.abort()
    assert read(info["path"], fmt).equals(again)
    # beside the as-of directory: nothing but the lock that publishes take turns on (outputs/files.py)
    assert sorted(p.name for p in expected.parent.parent.iterdir()) == [".publish.lock", "2024-03-01"]


def test_default_is_parquet_in_the_workspace_and_other_formats_are_kept(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    day = Path(cfg.workspace) / "predictions" / "churn" / "2024-03-01"
    assert write_table(open_writer(cfg, "predictions", "churn", AS_OF), [predictions(5)])["path"] == str(
        day / "predictions.parquet"
    )
    write_table(open_writer(cfg, "predictions", "churn", AS_OF, "csv"), [predictions(5)])
    assert sorted(p.name for p in day.iterdir()) == [
        "manifest.json",
        "predictions.csv",
        "predictions.parquet",
        "provenance.json",  # records that the directory has a manifest (a deleted one is then a failure)
    ]
    assert set(json.loads((day / "manifest.json").read_text())["files"]) == {
        "predictions.csv",
        "predictions.parquet",
        "provenance.json",
    }


def test_error_inside_the_write_loop_publishes_nothing(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)

    def failing() -> object:
        yield predictions(10)
        raise RuntimeError("scoring failed")

    with pytest.raises(RuntimeError):
        write_table(open_writer(cfg, "predictions", "churn", AS_OF), failing())
    assert not (Path(cfg.workspace) / "predictions" / "churn" / "2024-03-01").exists()
    assert list((Path(cfg.workspace) / "predictions" / "churn").iterdir()) == []


def test_embeddings_csv_flattens_vectors_and_caller_files_are_published(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    table = pa.table(
        {
            "entity_id": pa.array(["a", "b", "c"]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), 4),
        }
    )
    writer = open_writer(cfg, "embeddings", None, AS_OF, "csv")
    writer.write(table)
    np.save(writer.directory / "embeddings.npy", emb.astype(np.float16))
    info = writer.close()
    got = read(info["path"], "csv")
    assert got.column_names == [
        "entity_id",
        "embedding_0",
        "embedding_1",
        "embedding_2",
        "embedding_3",
        "as_of",
    ]
    assert np.array_equal(np.stack([got.column(f"embedding_{j}").to_numpy() for j in range(4)], 1), emb)
    assert (Path(info["path"]).parent / "embeddings.npy").exists()
    parquet = write_table(open_writer(cfg, "embeddings", None, AS_OF), [table])
    assert pq.read_table(parquet["path"]).column("embedding").to_pylist()[2] == [8, 9, 10, 11]


def test_outputs_config_destinations_and_errors(tiny_config: Path, tmp_path: Path) -> None:
    def mutate(raw: dict) -> None:
        raw["outputs"] = {
            "default": "exports",
            "destinations": {"exports": {"kind": "tsv", "path": str(tmp_path / "exports")}},
        }

    cfg = load_config(edit_config(tiny_config, mutate))
    info = write_table(open_writer(cfg, "predictions", "churn", AS_OF), [predictions(3)])
    assert info["path"] == str(
        tmp_path / "exports" / "predictions" / "churn" / "2024-03-01" / "predictions.tsv"
    )
    with pytest.raises(
        ConfigError, match="unknown output destination 'nope'; known: csv, exports, parquet, tsv"
    ):
        open_writer(cfg, "predictions", "churn", AS_OF, "nope")
    with pytest.raises(UserError, match="dataset must be one of"):
        open_writer(cfg, "scores", "churn", AS_OF)

    def bad(raw: dict) -> None:
        raw["outputs"] = {"default": "warehouse", "destinations": {}}

    with pytest.raises(ConfigError, match="'warehouse' is not a destination"):
        load_config(edit_config(tiny_config, bad))

    def bad_table(raw: dict) -> None:
        raw["outputs"] = {
            "destinations": {
                "wh": {
                    "kind": "clickhouse",
                    "table": "scores_{model}",
                    "connection_params": {"host": "localhost"},
                }
            }
        }

    with pytest.raises(ConfigError, match=r"only the placeholders \{dataset\} and \{scenario\}"):
        load_config(edit_config(tiny_config, bad_table))


def _with_table(table: str) -> Callable[[dict], None]:
    def mutate(raw: dict) -> None:
        raw["outputs"] = {
            "destinations": {
                "wh": {"kind": "clickhouse", "table": table, "connection_params": {"host": "localhost"}}
            }
        }

    return mutate


@pytest.mark.parametrize(
    "table",
    [
        "scores_{scenario.__class__}",
        "scores_{dataset.upper}",
        "scores_{dataset.nope}",
        "scores_{as_of.year}",
        "scores_{scenario[0]}",
        "scores_{scenario!r}",
        "scores_{scenario:>40}",
        "scores_{}",
        "scores_{0}",
        "scores_{scenario",
        "scores_}",
    ],
)
def test_table_template_with_more_than_plain_placeholders_is_a_one_line_config_error(
    tiny_config: Path, table: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(edit_config(tiny_config, _with_table(table)))
    message = str(info.value)
    assert "\n" not in message
    assert "outputs.destinations.wh.table" in message and repr(table) in message, message
    assert "{dataset} and {scenario}" in message, message


def test_table_template_with_plain_placeholders_and_escaped_braces_loads(tiny_config: Path) -> None:
    cfg = load_config(edit_config(tiny_config, _with_table("db.{dataset}_{{x}}_{scenario}")))
    _, destination = cfg.outputs.destination("wh")
    assert destination.table_name("predictions", "churn") == "db.predictions_{x}_churn"


def test_shard_parts_are_written_as_one_slice(tiny_config: Path, tmp_path: Path) -> None:
    cfg = load_config(tiny_config)
    parts = []
    for i in range(3):  # three shards' Parquet files
        parts.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(predictions(100, seed=i, start=100 * i), parts[-1])
    info = write_parquet_parts(open_writer(cfg, "predictions", "churn", AS_OF, "tsv"), parts, batch_rows=64)
    got = read(info["path"], "tsv")
    assert info["rows"] == 300 and got.column("entity_id").to_pylist() == list(range(300))
