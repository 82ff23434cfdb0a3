"""Fuzz: malformed configs (`basemodel validate`) and malformed data (`basemodel extract`) through the real CLI.

A seeded generator of mutations of the tiny dataset's config and its transactions source: keys deleted,
retyped or renamed, wrong enum values, negative and huge numbers, impossible dates, unknown columns, broken
YAML; an empty source file, wrong column types, null ids, unparseable timestamps. For every mutation:
exit code 2, exactly one line on stderr naming the problem, no traceback, nothing new left in the workspace.

Reproduce a failure with its case id (printed with the mutation); another seed: BASEMODEL_FUZZ_SEED=N.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from basemodel_pipeline.cli import app

SEED = int(os.environ.get("BASEMODEL_FUZZ_SEED", "20240518"))
CONFIG_CASES = 70
DATA_CASES = 16
runner = CliRunner()

Config = dict[str, Any]

# (path, required): deleting a required key must be an error
REQUIRED = [
    ("data_sources",),
    ("data_sources", 0, "name"),
    ("data_sources", 0, "type"),
    ("data_sources", 0, "data_location"),
    ("data_sources", 0, "data_location", "path"),
    ("data_sources", 0, "main_entity_column"),
    ("data_sources", 0, "date_column"),
    ("data_sources", 0, "date_column", "name"),
    ("data_sources", 1, "data_location", "database_type"),
    ("data_sources", 2, "main_entity_column"),
    ("data_params", "data_start_date"),
    ("scenarios", 0, "name"),
    ("scenarios", 0, "target"),
    ("scenarios", 0, "target", "kind"),
    ("scenarios", 1, "target", "column"),
]
WRONG_TYPES: list[tuple[tuple, Any]] = [
    (("data_sources", 0, "name"), [1, 2]),
    (("data_sources", 0, "allowed_columns"), {"store_id": 1}),
    (("data_sources", 0, "data_location"), "data/transactions.parquet"),
    (("data_sources", 0, "joined_data_sources"), "products"),
    (("data_params", "split_interval_days"), "weekly"),
    (("training_params", "foundation", "epochs"), "two"),
    (("training_params", "foundation", "hidden_dim"), [32]),
    (("training_params", "finetune", "batch_size"), {"size": 64}),
    (("scenarios", 0, "target", "horizon_days"), "soon"),
    (("scenarios",), {"name": "churn"}),
    (("data_sources",), "transactions"),
    (("training_params",), 3),
]
ENUMS: list[tuple[tuple, Any]] = [
    (("data_sources", 0, "type"), "evnt"),
    (("data_sources", 0, "data_location", "database_type"), "parquett"),
    (("scenarios", 0, "task"), "binery"),
    (("scenarios", 0, "target", "kind"), "churnn"),
    (("scenarios", 1, "task"), "multi-label"),
]
NUMBERS = [
    ("training_params", "foundation", "epochs"),
    ("training_params", "foundation", "hidden_dim"),
    ("training_params", "foundation", "num_blocks"),
    ("training_params", "foundation", "batch_size"),
    ("training_params", "foundation", "sketch_width"),
    ("training_params", "foundation", "split_points_per_entity"),
    ("training_params", "foundation", "horizon_days"),
    ("training_params", "finetune", "epochs"),
    ("training_params", "finetune", "patience"),
    ("data_params", "split_interval_days"),
    ("scenarios", 0, "target", "horizon_days"),
    ("scenarios", 0, "target", "active_in_last_days"),
    ("scenarios", 1, "target", "min_positive_entities"),
]
BAD_NUMBERS = [-1, -28, 0, 10**30, 10**19, float("inf"), float("nan"), 1e308]
DATES = ["data_start_date", "training_start_date", "validation_start_date", "training_end_date"]
BAD_DATES = ["2023-02-30", "2023-13-01", "yesterday", "", 20230101, "1899-01-01", "9999-12-31"]
UNKNOWN_COLUMNS: list[tuple[tuple, Any]] = [
    (("data_sources", 0, "allowed_columns"), ["store_id", "no_such_column"]),
    (("data_sources", 0, "main_entity_column"), "no_such_id"),
    (("data_sources", 0, "date_column", "name"), "no_such_time"),
    (("data_sources", 0, "joined_data_sources", 0, "join_on"), {"no_such_key": "product_id"}),
    (("data_sources", 2, "main_entity_column"), "no_such_id"),
    (("data_sources", 1, "allowed_columns"), ["product_id", "no_such_column"]),
    (("scenarios", 1, "target", "column"), "no_such_column"),
    (("data_sources", 0, "where_condition"), "no_such_column > 0"),
]
# data mutations that only `validate` refuses: `extract` copies the source per day and checks neither the entity
# ids' type against the other sources nor null ids (validate does; the cache build then fails or drops them)
BAD_YAML = [
    "data_sources: [unclosed\n",
    'workspace: "unclosed\n',
    "\tworkspace: .\n",
    "data_params:\n  data_start_date: 2023-01-01\n   split_interval_days: 7\n",
    "- just\n- a list\n",
    "just a scalar\n",
    "",
    "data_sources:\n  - &a [*a]\n",
    "key: value\n: nothing\n",
]


def get(cfg: Config, path: tuple) -> Any:
    for p in path:
        cfg = cfg[p]
    return cfg


def put(cfg: Config, path: tuple, value: Any) -> None:
    get(cfg, path[:-1])[path[-1]] = value


def key_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every dict key path of the config (list items included)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*prefix, k))
            out += key_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += key_paths(v, (*prefix, i))
    return out


def config_mutation(rng: random.Random, base: Config) -> tuple[str, Callable[[Path], None]]:
    """(description, apply(config file)) of one random config mutation."""
    cfg = copy.deepcopy(base)
    kind = rng.choice(["delete", "retype", "rename", "enum", "number", "date", "column", "yaml"])
    if kind == "yaml":
        text = rng.choice(BAD_YAML)
        return f"bad YAML {text!r}", lambda f: f.write_text(text)
    if kind == "delete":
        path = rng.choice(REQUIRED)
        del get(cfg, path[:-1])[path[-1]]
        what = f"delete {path}"
    elif kind == "retype":
        path, value = rng.choice(WRONG_TYPES)
        put(cfg, path, value)
        what = f"retype {path} = {value!r}"
    elif kind == "rename":
        path = rng.choice([p for p in key_paths(cfg) if isinstance(p[-1], str)])
        parent = get(cfg, path[:-1])
        parent[path[-1] + rng.choice(["_", "s", "X"])] = parent.pop(path[-1])
        what = f"rename {path}"
    elif kind == "enum":
        path, value = rng.choice(ENUMS)
        put(cfg, path, value)
        what = f"enum {path} = {value!r}"
    elif kind == "number":
        path, value = rng.choice(NUMBERS), rng.choice(BAD_NUMBERS)
        put(cfg, path, value)
        what = f"number {path} = {value!r}"
    elif kind == "date":
        if rng.random() < 0.3:  # dates out of order
            a, b = rng.sample(DATES, 2)
            p = cfg["data_params"]
            if a > b:
                a, b = b, a
            p[a], p[b] = p[b], p[a]
            what = f"dates swapped {a} <-> {b}"
        else:
            path, value = ("data_params", rng.choice(DATES)), rng.choice(BAD_DATES)
            put(cfg, path, value)
            what = f"date {path} = {value!r}"
    else:
        path, value = rng.choice(UNKNOWN_COLUMNS)
        put(cfg, path, value)
        what = f"column {path} = {value!r}"
    text = yaml.safe_dump(cfg, sort_keys=False)
    return what, lambda f: f.write_text(text)


def data_mutation(rng: random.Random) -> tuple[str, Callable[[Path], None]]:
    """(description, apply(transactions.parquet)) of one random data mutation."""
    kind = rng.choice(
        ["empty", "ids_float", "ids_null", "ts_text", "ts_bool", "ts_null", "ids_list", "no_rows"]
    )

    def apply(path: Path) -> None:
        if kind == "empty":
            path.write_bytes(b"")
            return
        table = pq.read_table(path)
        n = table.num_rows
        rows = sorted(rng.sample(range(n), max(1, n // rng.choice([2, 10, 100]))))
        mask = pa.array([i in set(rows) for i in range(n)])
        ids, ts = "household_id", "transaction_timestamp"
        if kind == "ids_float":
            col = pc.add(pc.cast(table[ids], pa.float64()), pa.scalar(0.5))
            table = table.set_column(table.schema.get_field_index(ids), ids, col)
        elif kind == "ids_null":
            col = pc.if_else(mask, pa.scalar(None, table[ids].type), table[ids])
            table = table.set_column(table.schema.get_field_index(ids), ids, col)
        elif kind == "ids_list":
            col = pa.array([[v] for v in table[ids].to_pylist()])
            table = table.set_column(table.schema.get_field_index(ids), ids, col)
        elif kind == "ts_text":
            text = pc.cast(table[ts], pa.string())
            col = pc.if_else(
                mask, pa.scalar(rng.choice(["yesterday", "2023-02-30 10:00:00", "12/31/2023"])), text
            )
            table = table.set_column(table.schema.get_field_index(ts), ts, col)
        elif kind == "ts_bool":
            col = pc.if_else(mask, pa.scalar(True), pa.scalar(False))
            table = table.set_column(table.schema.get_field_index(ts), ts, col)
        elif kind == "ts_null":
            col = pa.nulls(n, table[ts].type)
            table = table.set_column(table.schema.get_field_index(ts), ts, col)
        elif kind == "no_rows":
            table = table.slice(0, 0)
        pq.write_table(table, path)

    return kind, apply


def snapshot(root: Path) -> set[str]:
    """Files under a workspace (lock files aside: they are kept on purpose and hold nothing)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")}


def assert_one_line_user_error(args: list[str], root: Path, what: str) -> None:
    before = snapshot(root)
    result = runner.invoke(app, args)
    context = f"seed {SEED}, mutation {what}: exit {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output, context
    assert result.exit_code == 2, (context, result.exception)
    progress = "━"  # a progress bar's last state (rich prints it when stderr is not a terminal)
    lines = [line for line in result.stderr.splitlines() if line.strip() and progress not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), context
    assert len(lines[0]) > len("error: ") + 20, context  # says what is wrong, not just that something is
    assert snapshot(root) == before, (context, sorted(snapshot(root) - before))


@pytest.mark.parametrize("case", range(CONFIG_CASES))
def test_malformed_config_is_one_line(case: int, tiny_config: Path) -> None:
    rng = random.Random(f"{SEED}-config-{case}")
    what, apply = config_mutation(rng, yaml.safe_load(tiny_config.read_text()))
    apply(tiny_config)
    assert_one_line_user_error(["validate", str(tiny_config)], tiny_config.parent, what)


@pytest.mark.parametrize("case", range(DATA_CASES))
def test_malformed_data_is_one_line(case: int, tiny_config: Path) -> None:
    rng = random.Random(f"{SEED}-data-{case}")
    what, apply = data_mutation(rng)
    apply(tiny_config.parent / "data" / "transactions.parquet")
    assert_one_line_user_error(["validate", str(tiny_config)], tiny_config.parent, f"{what} (validate)")
    assert_one_line_user_error(["extract", str(tiny_config)], tiny_config.parent, f"{what} (extract)")
