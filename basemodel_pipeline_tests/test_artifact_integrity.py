"""Tampered or truncated artifacts: checkpoints and cache arrays carry checksums recorded when they were
written; loading a changed one is one line naming the file and what to do, and `basemodel verify` reports
every artifact of the workspace (exit code 1 when one is damaged)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.model.checkpoint import load_checkpoint, write_manifest
from basemodel_pipeline.workspace import cache_dir

runner = CliRunner()


@pytest.fixture
def workspace(tiny_trained: Path, tmp_path: Path) -> Path:
    """A private copy of a workspace with extracts, the cache, a foundation and the 'churn' scenario (times
    kept, the cache pointer kept a relative link)."""
    shutil.copytree(tiny_trained.parent, tmp_path / "ws", symlinks=True)
    return tmp_path / "ws" / "config.yaml"


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Change one byte in place (same size), as an editor or a bad disk would."""
    with open(path, "r+b") as fh:
        fh.seek(offset if offset is not None else path.stat().st_size - 1)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def verify(config: Path) -> tuple[int, list[str]]:
    result = runner.invoke(app, ["verify", str(config)])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, [line for line in result.stdout.splitlines() if line.strip()]


def line_of(lines: list[str], kind: str) -> str:
    """The line of the one artifact of a kind (`extract`, `cache`, ...) in verify's output."""
    [line] = [line for line in lines if line.split()[1] == kind]
    return line


def cache_file(config: Path, rel: str) -> Path:
    return cache_dir(load_config(config)).resolve() / rel


def one_line_error(args: list[str], *needles: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_verify_a_healthy_workspace(workspace: Path) -> None:
    code, lines = verify(workspace)
    assert code == 0, lines
    kinds = [line.split()[1] for line in lines]
    assert line_of(lines, "cache").startswith("ok"), lines
    assert {"extract", "foundation", "scenario"} <= set(kinds), lines
    assert all(line.startswith(("ok", "absent")) for line in lines), lines
    assert any(line.startswith("absent") and "department" in line for line in lines), lines


def test_a_cache_array_changed_in_place_is_refused_on_open_and_rebuilt_by_cache(workspace: Path) -> None:
    cfg = load_config(workspace)
    ts = cache_file(workspace, "events/transactions/ts.npy")
    flip_byte(ts, 200)
    with pytest.raises(UserError, match="ts.npy") as err:
        EventCache(cache_dir(cfg))
    assert "basemodel cache" in str(err.value) and "\n" not in str(err.value)
    one_line_error(["predict", str(workspace), "-s", "churn"], "ts.npy", "basemodel cache")

    code, lines = verify(workspace)
    cache = line_of(lines, "cache")
    assert code == 1 and cache.startswith("FAILED") and "ts.npy" in cache, lines
    assert all(line.startswith(("ok", "absent")) for line in lines if line != cache), lines

    result = runner.invoke(app, ["cache", str(workspace)])  # rebuilds, keeping entity indices and codes
    assert result.exit_code == 0, result.output
    warning = " ".join(result.stderr.split())  # the log wraps long lines
    assert "ts.npy: changed after the cache was written" in warning and "rebuilding it" in warning, warning
    assert verify(workspace)[0] == 0
    with EventCache(cache_dir(cfg)) as cache:
        assert cache.n_entities > 0


def test_a_truncated_cache_array_is_refused_on_open(workspace: Path) -> None:
    offsets = cache_file(workspace, "events/transactions/offsets.npy")
    truncate(offsets)
    with pytest.raises(UserError, match="offsets.npy.*bytes"):
        EventCache(cache_dir(load_config(workspace)))
    code, lines = verify(workspace)
    assert code == 1 and "offsets.npy" in line_of(lines, "cache"), lines


def test_an_edit_that_restores_the_time_is_found_by_verify(workspace: Path) -> None:
    """Opening checks sizes and modification times (cheap); the full sha256 is `basemodel verify`'s."""
    column = sorted(cache_file(workspace, "events/transactions").glob("col_*.npy"))[0]
    before = column.stat()
    flip_byte(column)
    os.utime(column, ns=(before.st_atime_ns, before.st_mtime_ns))
    EventCache(cache_dir(load_config(workspace))).close()
    code, lines = verify(workspace)
    cache = line_of(lines, "cache")
    assert code == 1 and column.name in cache and "sha256" in cache, lines


def test_a_moved_workspace_whose_times_changed_still_opens(workspace: Path) -> None:
    """A copy that did not keep modification times (cp -r) is hashed instead, and passes."""
    for f in cache_file(workspace, "").rglob("*.npy"):
        os.utime(f)
    EventCache(cache_dir(load_config(workspace))).close()
    assert verify(workspace)[0] == 0


def test_a_flipped_byte_in_the_foundation_weights(workspace: Path) -> None:
    cfg = load_config(workspace)
    weights = ws.latest_foundation_dir(cfg) / "model.safetensors"
    flip_byte(weights)
    with pytest.raises(UserError, match="model.safetensors") as err:
        load_checkpoint(weights.parent)
    assert "basemodel pretrain" in str(err.value)
    one_line_error(["finetune", str(workspace), "-s", "churn"], str(weights), "basemodel pretrain")
    code, lines = verify(workspace)
    bad = [line for line in lines if line.startswith("FAILED")]
    assert code == 1 and len(bad) == 1 and "foundation" in bad[0] and "model.safetensors" in bad[0], lines


def test_a_truncated_scenario_checkpoint(workspace: Path) -> None:
    cfg = load_config(workspace)
    weights = ws.latest_scenario_dir(cfg, "churn") / "model.safetensors"
    truncate(weights)
    one_line_error(["predict", str(workspace), "-s", "churn"], str(weights), "basemodel finetune")
    code, lines = verify(workspace)
    bad = [line for line in lines if line.startswith("FAILED")]
    assert code == 1 and len(bad) == 1 and "churn" in bad[0] and "bytes" in bad[0], lines


def test_an_edited_model_json_with_a_rehashed_manifest_is_still_one_line(workspace: Path) -> None:
    """The checksums are not keyed: an edit of model.json followed by a new manifest passes them (what
    docs/reliability.md says they cannot detect). model.json is then read as a typed record and checked
    against the weights, so a broken one is still one line."""
    cfg = load_config(workspace)
    directory = ws.latest_scenario_dir(cfg, "churn")

    def edit(meta: dict | str) -> None:
        (directory / "model.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
        write_manifest(directory)

    meta = json.loads((directory / "model.json").read_text())
    hidden = meta["arch"]["hidden_dim"]
    meta["arch"]["hidden_dim"] = 10**9  # absurd: must not allocate it
    edit(meta)
    with pytest.raises(UserError, match="model.json"):
        load_checkpoint(directory)
    meta["arch"]["hidden_dim"] = "wide"  # read as a typed record (CheckpointMeta): the field is named
    edit(meta)
    with pytest.raises(
        UserError, match=r"model.json: unreadable \(arch.hidden_dim: Input should be a valid integer"
    ):
        load_checkpoint(directory)
    meta["arch"]["hidden_dim"] = hidden
    target = dict(meta["target"])
    meta["target"]["log1pp"] = True  # the target's details are the task's typed record: the field is named
    edit(meta)
    one_line_error(
        ["predict", str(workspace), "-s", "churn"],
        "unreadable target (log1pp: Extra inputs",
        "basemodel finetune",
    )
    meta["target"] = target
    del meta["target"]  # a foundation's fields under a scenario's name
    edit(meta)
    one_line_error(
        ["predict", str(workspace), "-s", "churn"], "not a scenario checkpoint", "basemodel finetune"
    )
    meta["target"] = target
    del meta["published"]  # an older format: refused, never guessed
    edit(meta)
    one_line_error(
        ["predict", str(workspace), "-s", "churn"], "names no published candidate", "basemodel finetune"
    )
    edit("{not json")
    one_line_error(["predict", str(workspace), "-s", "churn"], "model.json", "basemodel finetune")
    code, lines = verify(workspace)
    assert code == 1 and any(line.startswith("FAILED") and "model.json" in line for line in lines), lines
