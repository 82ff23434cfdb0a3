"""Disk faults on a real small volume (a tmpfs mounted for the test; skipped where mounting is not allowed):
a full disk and a read-only workspace end in one line naming the path and what to do, with nothing
partial left: no staging directory, no half-written version, LATEST unchanged."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_pretrain

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def volume(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill(path: Path, leave: int = 0) -> None:
    """Fill the volume of `path`, then free `leave` bytes."""
    filler = path / "filler.bin"
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: a partial last block is not flushed at close
        block = b"\0" * (1 << 16)
        while True:
            try:
                fh.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))


def config_on(tiny_dataset: Path, tmp_path: Path, workspace: Path) -> Path:
    """The tiny config with its data under tmp_path and its workspace at `workspace`."""
    shutil.copytree(tiny_dataset.parent / "data", tmp_path / "data")
    text = tiny_dataset.read_text().replace("workspace: .", f"workspace: {workspace}")
    config = tmp_path / "config.yaml"
    config.write_text(text)
    return config


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process (a SIGBUS there must not take the test run down)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    command = [sys.executable, "-m", "basemodel_pipeline.cli", args[0], str(config), *args[1:]]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def one_line(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def leftovers(root: Path) -> list[str]:
    """Hidden temporaries (staging directories, their owner files) anywhere under `root`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp*"))


@pytest.fixture
def trained_on_volume(tiny_dataset: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    with volume(tmp_path / "vol", "24m") as vol:
        config = config_on(tiny_dataset, tmp_path, vol)
        cfg = load_config(config)
        run_extract(cfg)
        run_cache(cfg)
        run_pretrain(cfg)
        yield config, vol


def test_finetune_on_a_full_disk(trained_on_volume: tuple[Path, Path]) -> None:
    config, vol = trained_on_volume
    fill(vol, leave=16 << 10)
    line = one_line(cli(config, "finetune", "-s", "churn"), "no space left on", str(vol), "free space")
    assert "move the workspace" in line
    root = ws.scenario_root(load_config(config), "churn")
    assert not root.exists() or (not (root / "LATEST").exists() and not fs.versions(root))
    assert leftovers(vol) == []
    days = sorted((vol / "extracts" / "transactions").glob("*.parquet"))
    one_line(cli(config, "extract"), "no space left on", str(vol))
    assert sorted((vol / "extracts" / "transactions").glob("*.parquet")) == days
    assert leftovers(vol) == []


def test_predict_on_a_full_disk_then_with_room(trained_on_volume: tuple[Path, Path]) -> None:
    config, vol = trained_on_volume
    run_finetune(load_config(config), "churn")
    fill(vol, leave=8 << 10)
    one_line(cli(config, "predict", "-s", "churn"), "no space left on", str(vol))
    assert not list(vol.glob("predictions/**/*.parquet"))
    assert leftovers(vol) == []
    (vol / "filler.bin").unlink()
    done = cli(config, "predict", "-s", "churn")
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((vol / "predictions").rglob("predictions.parquet"))


def test_cache_build_running_out_of_space_midway(tiny_dataset: Path, tmp_path: Path) -> None:
    """The free-space preflight is told there is room (as when another writer fills the volume meanwhile)."""
    with volume(tmp_path / "vol", "24m") as vol:
        cfg = load_config(config_on(tiny_dataset, tmp_path, vol))
        run_extract(cfg)
        fill(vol, leave=32 << 10)
        plenty = shutil.disk_usage(tmp_path)
        with pytest.raises(UserError, match=f"no space left on {vol}") as err:
            run_cache(cfg, disk_usage=lambda _: plenty)
        assert "\n" not in str(err.value)
        cache = vol / "cache"
        assert not list(cache.glob("**/manifest.json"))
        assert leftovers(vol) == []


def test_a_read_only_workspace(tiny_dataset: Path, tmp_path: Path) -> None:
    with volume(tmp_path / "vol", "24m") as vol:
        config = config_on(tiny_dataset, tmp_path, vol)
        run_extract(load_config(config))
        remount_read_only(vol)
        for stage in ("extract", "cache"):
            one_line(cli(config, stage), "not writable", str(vol), "workspace")


def test_explain_on_a_read_only_workspace(trained_on_volume: tuple[Path, Path]) -> None:
    """explain only reads: on a read-only workspace it explains, and its files go to a temporary directory."""
    config, vol = trained_on_volume
    run_finetune(load_config(config), "churn")
    remount_read_only(vol)
    done = cli(config, "explain", "-s", "churn", "--population", "20")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    warning = " ".join(done.stderr.split())
    assert f"warning: {vol / 'explanations' / 'churn'}/" in warning and "(read-only file system)" in warning
    written = Path(warning.split(" written to ")[1].split()[0])
    assert (written / "population.json").is_file()
    shutil.rmtree(written)


def test_permission_denied_counts_as_a_workspace_fault_only_inside_the_workspace(tmp_path: Path) -> None:
    from basemodel_pipeline.diskfaults import NotWritable, translate

    workspace = tmp_path / "ws"
    (workspace / "cache").mkdir(parents=True)
    inside = PermissionError(errno.EACCES, "Permission denied", str(workspace / "cache" / ".x.1-ab.tmp"))
    error = translate(inside, workspace)
    assert isinstance(error, NotWritable) and str(error).startswith(f"{workspace / 'cache'} is not writable")
    outside = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "data" / "t.parquet"))
    assert translate(outside, workspace) is None  # a source the user may not read: its own error


def test_a_checkpoint_that_cannot_fit_fails_before_writing(tmp_path: Path) -> None:
    """The size of a checkpoint is known before it is written: the preflight names what it needs."""
    from basemodel_pipeline.model.checkpoint import (
        CheckpointMeta,
        TrunkConfig,
        build_model,
        publish_checkpoint,
    )

    arch = TrunkConfig(in_dim=1000, hidden_dim=512, num_blocks=2, dropout=0.0, out_dim=10)
    model, meta = build_model(arch), CheckpointMeta(kind="foundation", arch=arch)
    needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    with volume(tmp_path / "vol", "24m") as vol:
        root = vol / "checkpoints" / "foundation"
        root.mkdir(parents=True)
        fill(vol, leave=needed // 2)
        with pytest.raises(UserError, match=r"for checkpoint foundation/\S+: it needs about [\d,]+ bytes"):
            publish_checkpoint(root, model, meta, promote=True)
        assert list(root.iterdir()) == []  # no staging directory, no version, no LATEST
        (vol / "filler.bin").unlink()
        version, final = publish_checkpoint(root, model, meta, promote=True)
        assert (final / "model.safetensors").stat().st_size > needed


def test_a_predict_whose_table_is_published_does_not_fail_on_the_drift_reference(
    trained_on_volume: tuple[Path, Path],
) -> None:
    """The drift reference is written after the predictions are published: when it cannot be written (here
    a file stands where its directory goes), predict warns in one line and succeeds, the table verifies, and
    no drift figure is invented."""
    config, vol = trained_on_volume
    cfg = load_config(config)
    run_finetune(cfg, "churn")
    blocker = ws.drift_reference(cfg, "churn", "x").parent
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    done = cli(config, "predict", "-s", "churn")
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "drift reference" in line]
    assert len(warnings) == 1 and "not saved" in warnings[0] and "Traceback" not in done.stderr
    table = list((vol / "predictions" / "churn").rglob("predictions.parquet"))
    assert len(table) == 1
    verified = cli(config, "verify")
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
