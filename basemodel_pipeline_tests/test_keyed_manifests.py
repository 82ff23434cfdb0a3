"""Keyed manifests (BASEMODEL_MANIFEST_KEY). With the key set, every manifest and record the pipeline writes
carries an HMAC-SHA256 of its content under the key, and every reader that checks integrity refuses one whose
signature is missing, made with another key, or does not match: an edit followed by re-hashed checksums (what
unkeyed checksums cannot catch) is refused by loading and by `basemodel verify`. Without the key nothing
changes, and verify says a signature was not checked. The key itself is written nowhere."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.training import resume
from basemodel_pipeline_tests.test_manifest_integrity import failed, flip_byte, one_line_error, verify

KEY = "k3y-of-the-tests-5d1f0c9a8b7e6d5c4b3a2f1e"
OTHER = "another-k3y-of-the-tests-0a1b2c3d4e5f6a7b"
ENV = "BASEMODEL_MANIFEST_KEY"
KINDS = {"extract", "cache", "foundation", "scenario", "state", "predictions", "embeddings"}
runner = CliRunner()


def run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def keyed(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(config.yaml, everything the stages printed) of a workspace every stage wrote with the key set:
    extracts, cache, foundation, 'churn', its predictions (and state), embeddings. Never modified."""
    d = tmp_path_factory.mktemp("keyed") / "ws"
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    config = str(shutil.copy(tiny_dataset, d / "config.yaml"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, KEY)
        printed = [
            run("extract", config),
            run("cache", config),
            run("pretrain", config),
            run("finetune", config, "-s", "churn"),
            run("predict", config, "-s", "churn"),
            run("embed", config),
        ]
    return Path(config), "\n".join(printed)


@pytest.fixture
def workspace(keyed: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the keyed workspace, with the key set."""
    shutil.copytree(keyed[0].parent, tmp_path / "ws", symlinks=True)
    monkeypatch.setenv(ENV, KEY)
    return tmp_path / "ws" / "config.yaml"


def rehash(manifest: Path, *changed: Path) -> None:
    """What someone without the key does after editing files: record their new sizes, sha256 (and times)
    in the manifest, leaving everything else as it was, the signature included."""
    record = json.loads(manifest.read_text())
    for path in changed:
        entry = record["files"][str(path.relative_to(manifest.parent))]
        entry.update(bytes=path.stat().st_size, sha256=manifests.sha256_file(path))
        if "mtime_ns" in entry:
            entry["mtime_ns"] = path.stat().st_mtime_ns
    manifest.write_text(json.dumps(record, indent=2))


def without_signature(manifest: Path) -> None:
    record = json.loads(manifest.read_text())
    del record["signature"]
    manifest.write_text(json.dumps(record, indent=2))


def secret_free(*texts: str) -> None:
    for text in texts:
        assert KEY not in text and OTHER not in text, text


def test_every_artifact_verifies_with_the_key_and_the_key_is_written_nowhere(
    keyed: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, printed = keyed
    monkeypatch.setenv(ENV, KEY)
    code, lines = verify(config)
    assert code == 0, lines
    kinds = {line.split()[1] for line in lines if line.startswith("ok") and "keyed, checked" in line}
    assert kinds == {"extract", "cache", "foundation", "scenario", "state", "predictions", "embeddings"}, (
        lines
    )
    files = [p for p in config.parent.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) > 50
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
    secret_free(printed, *lines)
    assert "signature" in json.loads(
        (ws.latest_scenario_dir(load_config(config), "churn") / "manifest.json").read_text()
    )


def test_without_the_key_a_signature_is_not_checked_and_verify_says_so(
    keyed: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = keyed
    monkeypatch.delenv(ENV, raising=False)
    code, lines = verify(config)
    assert code == 0, lines
    ok = [line for line in lines if line.startswith("ok")]
    assert {line.split()[1] for line in ok} == KINDS, lines
    assert all("keyed, not checked: BASEMODEL_MANIFEST_KEY unset" in line for line in ok), lines


def test_an_edited_checkpoint_with_a_rehashed_manifest_is_refused(workspace: Path) -> None:
    directory = ws.latest_scenario_dir(load_config(workspace), "churn")
    weights = directory / "model.safetensors"
    flip_byte(weights)
    rehash(directory / "manifest.json", weights)
    with pytest.raises(UserError, match="altered") as err:
        load_checkpoint(directory)
    line = one_line_error(
        ["predict", str(workspace), "-s", "churn"],
        str(directory / "manifest.json"),
        "the manifest was altered after it was written",
        "basemodel finetune CONFIG -s churn",
    )
    [bad] = failed(workspace)
    assert bad.startswith("FAILED scenario churn") and "altered" in bad, bad
    without_signature(directory / "manifest.json")
    unsigned = one_line_error(
        ["explain", str(workspace), "-s", "churn"],
        "not signed",
        "BASEMODEL_MANIFEST_KEY",
        "basemodel finetune",
    )
    secret_free(str(err.value), line, bad, unsigned)


def test_an_edited_cache_array_with_a_rehashed_manifest_is_refused(workspace: Path) -> None:
    version = ws.cache_dir(load_config(workspace)).resolve()
    ts = version / "events" / "transactions" / "ts.npy"
    flip_byte(ts)
    rehash(version / "manifest.json", ts)
    line = one_line_error(
        ["predict", str(workspace), "-s", "churn"],
        "event cache",
        "the manifest was altered after it was written",
        "basemodel cache CONFIG",
    )
    bad = failed(workspace)
    assert any(b.startswith("FAILED cache") and "altered" in b for b in bad), bad
    secret_free(line, *bad)


@pytest.mark.parametrize(
    "output", ["predictions/churn/*/predictions.parquet", "embeddings/*/embeddings.parquet"]
)
def test_an_edited_output_with_a_rehashed_manifest_fails_verify(workspace: Path, output: str) -> None:
    [table] = workspace.parent.glob(output)
    flip_byte(table)
    rehash(table.parent / "manifest.json", table)
    [bad] = failed(workspace)
    assert bad.startswith(f"FAILED {output.split('/')[0]}") and "altered" in bad, bad
    assert "basemodel predict" in bad or "basemodel embed" in bad, bad
    secret_free(bad)


def test_a_workspace_written_without_the_key_is_refused_once_it_is_set(
    tiny_scored: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(tiny_scored.parent, tmp_path / "ws", symlinks=True)
    config = tmp_path / "ws" / "config.yaml"
    monkeypatch.setenv(ENV, KEY)
    line = one_line_error(["predict", str(config), "-s", "churn"], "not signed", ENV, "basemodel")
    gate = one_line_error(["promote", str(config), "-s", "churn"], "fails its gates", "not signed", ENV)
    bad = failed(config)
    kinds = {b.split()[1] for b in bad}
    assert kinds == KINDS, bad
    assert all("not signed" in b and ENV in b and ("re-run" in b or "rebuild" in b) for b in bad), bad
    secret_free(line, gate, *bad)
    warned = run("cache", str(config))  # the stage that writes it again, with the key: a fresh cache
    assert "not signed" in " ".join(warned.split()) and "rebuilding it" in " ".join(warned.split())
    code, lines = verify(config)
    cache = next(x for x in lines if x.split()[1] == "cache")
    assert cache.startswith("ok") and "keyed, checked" in cache, lines


def test_a_wrong_key_is_refused(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, OTHER)
    line = one_line_error(["predict", str(workspace), "-s", "churn"], "signed with another key", ENV)
    bad = failed(workspace)
    assert {b.split()[1] for b in bad} == KINDS and all("signed with another key" in b for b in bad), bad
    ids = {manifests.key_id(KEY.encode()), manifests.key_id(OTHER.encode())}
    assert all(i in line for i in ids), line  # which key each is, by its id
    secret_free(line, *bad)


def test_a_training_state_saved_under_another_key_is_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume state of a training run (state.json) is signed too: one saved without the key or under
    another is reported and training starts afresh."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    info = resume.RunState(step=3).info()
    for saved_with, loaded_with in ((KEY, KEY), (None, KEY), (OTHER, KEY)):
        monkeypatch.delenv(ENV, raising=False)
        if saved_with:
            monkeypatch.setenv(ENV, saved_with)
        resume.save_state(tmp_path / "state", "k", model, opt, sched, None, info)
        monkeypatch.setenv(ENV, loaded_with)
        warnings: list[str] = []
        loaded = resume.load_state(tmp_path / "state", "k", model, opt, sched, warn=warnings.append)
        if saved_with == loaded_with:
            assert loaded is not None and loaded[0]["step"] == 3 and not warnings
        else:
            assert loaded is None and len(warnings) == 1 and ENV in warnings[0], warnings
            secret_free(*warnings)


def test_the_launcher_forwards_the_key_to_step_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training and scoring steps in trainer containers write and read artifacts too: the key reaches them
    (by value, as the forwarded secrets do), and is never in what the launcher reports."""
    from basemodel_pipeline.defs.shared.resources import launcher_from_env

    monkeypatch.setenv("BASEMODEL_FORWARD_ENV", "")
    monkeypatch.delenv(ENV, raising=False)
    assert ENV not in launcher_from_env("prod").step_env()
    monkeypatch.setenv(ENV, KEY)
    launcher = launcher_from_env("prod")
    assert launcher.step_env()[ENV] == KEY
    secret_free(json.dumps(launcher.model_dump()))


def test_a_deleted_version_is_not_taken_for_one_never_made(workspace: Path) -> None:
    """Removing a whole signed artifact leaves what names it: a checkpoint root's LATEST, the cache's pointer.
    Loading is one line and verify fails (not `absent`)."""
    cfg = load_config(workspace)
    scenario = ws.latest_scenario_dir(cfg, "churn")
    shutil.rmtree(scenario)
    line = one_line_error(
        ["predict", str(workspace), "-s", "churn"], f"names {scenario.name}, which is missing"
    )
    shutil.rmtree(ws.cache_dir(cfg).resolve())
    bad = failed(workspace)
    assert any(b.startswith("FAILED scenario churn LATEST") and "which is missing" in b for b in bad), bad
    assert any(b.startswith("FAILED cache") and "which is missing" in b for b in bad), bad
    secret_free(line, *bad)


def test_a_state_whose_signature_fails_is_rebuilt_by_predict(workspace: Path) -> None:
    """The per-entity state is derived: verify fails it, and the next `predict` rebuilds it, signed."""
    [manifest] = (workspace.parent / "state").glob("*/manifest.json")
    without_signature(manifest)
    [bad] = failed(workspace)
    assert bad.startswith("FAILED state") and "not signed" in bad, bad
    logged = " ".join(run("predict", str(workspace), "-s", "churn").split())
    assert "not signed" in logged and "rebuilding it" in logged, logged
    assert verify(workspace)[0] == 0
    secret_free(bad, logged)
