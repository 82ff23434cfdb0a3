"""Integrity cannot be switched off by deleting a manifest: every artifact is written with its checksums and
says so where deleting the manifest leaves it (a checkpoint's model.json, an output's provenance.json, the
cache pointer, the extract's record), so a missing manifest is a failure: loading a checkpoint is one line
(exit code 2) and `basemodel verify` reports FAILED with exit code 1. `verify` covers the extracts (sizes and
sha256 recorded at extract time), the cache, checkpoints, states, predictions, subsets and embeddings."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.sources.extract_record import OWN_RECORD

runner = CliRunner()


def ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.output


@pytest.fixture
def workspace(tiny_scored: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny_scored.parent, tmp_path / "ws", symlinks=True)
    return tmp_path / "ws" / "config.yaml"


def verify(config: Path) -> tuple[int, list[str]]:
    result = runner.invoke(app, ["verify", str(config)])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, [" ".join(line.split()) for line in result.stdout.splitlines() if line.strip()]


def failed(config: Path) -> list[str]:
    """verify's FAILED lines (exit code 1 asserted)."""
    code, lines = verify(config)
    bad = [line for line in lines if line.startswith("FAILED")]
    assert code == 1 and bad, (code, lines)
    return bad


def one_line_error(args: list[str], *needles: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    line = " ".join(lines[0].split())
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def flip_byte(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_verify_lists_every_kind_of_artifact_ok(workspace: Path) -> None:
    code, lines = verify(workspace)
    assert code == 0, lines
    kinds = {line.split()[1] for line in lines if line.startswith("ok")}
    assert kinds == {"extract", "cache", "foundation", "scenario", "state", "predictions", "embeddings"}, (
        lines
    )
    assert any(line.startswith("ok predictions") and "subset vip" in line for line in lines), lines


def test_every_artifact_records_that_it_has_a_manifest(workspace: Path) -> None:
    """The marker lives outside the manifest, so deleting the manifest cannot make the artifact look like
    one written without checksums."""
    cfg = load_config(workspace)
    for directory in (ws.latest_foundation_dir(cfg), ws.latest_scenario_dir(cfg, "churn")):
        assert json.loads((directory / "model.json").read_text())["checksums"] == "manifest.json"
    outputs = [*workspace.parent.glob("predictions/churn/2*"), *workspace.parent.glob("embeddings/2*")]
    outputs += list(workspace.parent.glob("predictions/churn/*/subsets/*"))
    assert len(outputs) == 3, outputs
    for directory in outputs:
        assert ws.read_provenance(directory)["checksums"] == "manifest.json"  # type: ignore[index]
    record = json.loads((ws.extracts_dir(cfg, "transactions") / OWN_RECORD).read_text())
    assert record["pending"] == [] and record["files"]
    for name, entry in record["files"].items():
        path = ws.extracts_dir(cfg, "transactions") / name
        assert entry == {"bytes": path.stat().st_size, "sha256": manifests.sha256_file(path)}


def test_a_checkpoint_without_its_manifest_is_refused_by_every_stage(workspace: Path) -> None:
    cfg = load_config(workspace)
    scenario = ws.latest_scenario_dir(cfg, "churn")
    (scenario / "manifest.json").unlink()
    one_line_error(
        ["predict", str(workspace), "-s", "churn"],
        f"{scenario / 'manifest.json'}: missing: the files cannot be checked",
        "basemodel finetune CONFIG -s churn",
    )
    one_line_error(["explain", str(workspace), "-s", "churn"], "manifest.json: missing")
    foundation = ws.latest_foundation_dir(cfg)
    (foundation / "manifest.json").unlink()
    one_line_error(
        ["embed", str(workspace)], f"{foundation / 'manifest.json'}: missing", "basemodel pretrain"
    )
    one_line_error(
        ["finetune", str(workspace), "-s", "churn"], "manifest.json: missing", "basemodel pretrain"
    )
    bad = failed(workspace)
    assert len(bad) == 2, bad
    assert any(line.startswith("FAILED foundation") and "manifest.json: missing" in line for line in bad), bad
    assert any(
        line.startswith("FAILED scenario churn") and "manifest.json: missing" in line for line in bad
    ), bad


def _cache_manifest(cfg: Path) -> Path:
    return ws.cache_dir(load_config(cfg)).resolve() / "manifest.json"


def _extract_record(cfg: Path) -> Path:
    return ws.extracts_dir(load_config(cfg), "transactions") / OWN_RECORD


def _checkpoint_manifest(cfg: Path) -> Path:
    return ws.latest_foundation_dir(load_config(cfg)) / "manifest.json"


def _state_manifest(cfg: Path) -> Path:
    [manifest] = (cfg.parent / "state").glob("*/manifest.json")
    return manifest


def _predictions_manifest(cfg: Path) -> Path:
    [manifest] = (cfg.parent / "predictions" / "churn").glob("*/manifest.json")
    return manifest


def _subset_manifest(cfg: Path) -> Path:
    [manifest] = (cfg.parent / "predictions" / "churn").glob("*/subsets/vip/manifest.json")
    return manifest


def _embeddings_manifest(cfg: Path) -> Path:
    [manifest] = (cfg.parent / "embeddings").glob("*/manifest.json")
    return manifest


@pytest.mark.parametrize(
    ("kind", "manifest"),
    [
        ("extract", _extract_record),
        ("cache", _cache_manifest),
        ("foundation", _checkpoint_manifest),
        ("state", _state_manifest),
        ("predictions", _predictions_manifest),
        ("predictions", _subset_manifest),
        ("embeddings", _embeddings_manifest),
    ],
    ids=["extract", "cache", "checkpoint", "state", "predictions", "subset", "embeddings"],
)
def test_a_deleted_manifest_fails_verify(
    workspace: Path, kind: str, manifest: Callable[[Path], Path]
) -> None:
    """Never `ok ... no checksums recorded` nor `absent`: FAILED, naming the manifest, exit code 1."""
    path = manifest(workspace)
    path.unlink()
    [bad] = failed(workspace)
    assert bad.startswith(f"FAILED {kind}"), bad
    assert f"{path.name} missing: the files cannot be checked" in bad or "manifest.json: missing" in bad, bad


def test_a_cache_without_its_manifest_is_one_line_and_rebuilt_by_cache(workspace: Path) -> None:
    manifest = _cache_manifest(workspace)
    manifest.unlink()
    one_line_error(["predict", str(workspace), "-s", "churn"], "manifest.json missing", "basemodel cache")
    result = runner.invoke(app, ["cache", str(workspace)])
    assert result.exit_code == 0, result.output
    assert "manifest.json missing or unreadable; rebuilding it" in " ".join(result.stderr.split())
    assert verify(workspace)[0] == 0


def test_a_corrupt_extract_file_fails_verify_naming_it(workspace: Path) -> None:
    """The sizes and sha256 recorded at extract time: a flipped byte or a truncated day file is named, and
    a Parquet file the extract did not write too; a new extract makes it whole again."""
    out = ws.extracts_dir(load_config(workspace), "transactions")
    day = sorted(out.glob("*.parquet"))[5]
    flip_byte(day)
    [bad] = failed(workspace)
    assert bad.startswith("FAILED extract") and f"{day.name}: changed after it was written" in bad, bad
    assert "basemodel extract CONFIG --source transactions" in bad, bad
    day.write_bytes(day.read_bytes()[:100])
    [bad] = failed(workspace)
    assert f"{day.name}: 100 bytes" in bad, bad
    ok(["extract", str(workspace), "--source", "transactions"])
    assert verify(workspace)[0] == 0
    shutil.copy(day, out / "backup.parquet")
    [bad] = failed(workspace)
    assert "backup.parquet: not in .files.json" in bad, bad


def test_an_interrupted_extract_is_reported_until_the_next_one_records_its_files(workspace: Path) -> None:
    """A killed run leaves its day range pending in the record: its files are its own (the next extract
    does not refuse them) but not checked, so verify fails until a run records them."""
    import datetime as dt

    from basemodel_pipeline.pipeline import run_extract

    cfg = load_config(workspace)
    out = ws.extracts_dir(cfg, "transactions")
    record = json.loads((out / OWN_RECORD).read_text())
    first = sorted(out.glob("*.parquet"))[0]
    new_day = out / f"{dt.date.fromisoformat(first.stem) - dt.timedelta(days=1)}.parquet"
    shutil.copy(first, new_day)  # a day the killed run wrote, not recorded yet
    record["pending"] = [[None, None]]
    (out / OWN_RECORD).write_text(json.dumps(record))
    [bad] = failed(workspace)
    assert "an extract was interrupted" in bad and "basemodel extract" in bad, bad
    last = sorted(out.glob("*.parquet"))[-1]
    days = (dt.date.fromisoformat(last.stem), dt.date.fromisoformat(last.stem) + dt.timedelta(days=1))
    run_extract(cfg, "transactions", days=days)  # another range: the pending one is recorded too
    after = json.loads((out / OWN_RECORD).read_text())
    assert after["pending"] == [] and new_day.name in after["files"], after
    assert verify(workspace)[0] == 0


def test_an_extract_record_of_an_older_format_is_refused(workspace: Path) -> None:
    """A record of names only (no sizes, no checksums) is not read as one: the extract is written again."""
    out = ws.extracts_dir(load_config(workspace), "transactions")
    record = json.loads((out / OWN_RECORD).read_text())
    (out / OWN_RECORD).write_text(json.dumps({"files": sorted(record["files"]), "pending": []}))
    [bad] = failed(workspace)
    assert bad.startswith("FAILED extract") and OWN_RECORD in bad and "extract again" in bad, bad
