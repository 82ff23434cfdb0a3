"""The docker launcher end to end on a real Docker engine: each training and scoring step runs in the CPU
trainer image through dagster-docker's PipesDockerClient, with the workspace bind-mounted at the same path.

Needs the project's local engine and images (`deploy/local-engine.sh start && deploy/local-engine.sh images`,
as root; .ci/run does it where it runs as root); skipped with that instruction when no engine answers.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import dagster as dg
import pytest

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.launcher import RUN_ID_LABEL, Launcher
from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.predictions.assets import predictions
from basemodel_pipeline.defs.resources import BasemodelConfigResource
from basemodel_pipeline.pipeline import run_cache, run_extract

pytestmark = pytest.mark.timeout(900)

IMAGE = "basemodel-trainer:latest"
SECRET_NAME = "BASEMODEL_TEST_WAREHOUSE_TOKEN"


def _materialize(assets, config: Path, launcher: Launcher, instance, partition: str | None = None):
    return dg.materialize(
        assets,
        instance=instance,
        resources={
            "launcher": launcher,
            "basemodel_config": BasemodelConfigResource(config_path=str(config)),
        },
        partition_key=partition,
        raise_on_error=False,
    )


def _chown(root: Path, uid: int, gid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


def _leftover(engine, run_id: str) -> list:
    return engine.client.containers.list(all=True, filters={"label": f"{RUN_ID_LABEL}={run_id}"})


def _failure(result: dg.ExecuteInProcessResult) -> str:
    (failure,) = result.get_step_failure_events()
    return failure.step_failure_data.user_failure_data.description or ""


def test_steps_run_in_the_trainer_image(
    docker_engine, tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test hands the workspace to the container's uid")
    docker_engine.require(IMAGE)
    workspace = tiny_config.parent
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    token = secrets.token_hex(16)
    monkeypatch.setenv(SECRET_NAME, token)
    launcher = Launcher(
        backend="docker",
        image=IMAGE,
        workspace_dir=str(workspace),
        env={"CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"},
        forward_env=[SECRET_NAME],
        docker_network="host",
    )
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(scenarios_partitions.name, ["churn", "no_such_scenario"])

        # a workspace the container's user cannot write: one clear line, and no container was started
        assert launcher.container_user() == "1000:1000"  # root owns it: the image's own user
        denied = _materialize([foundation_model], tiny_config, launcher, instance)
        assert not denied.success
        message = _failure(denied)
        assert "cannot write" in message and f"chown -R 1000:1000 {workspace}" in message
        assert not _leftover(docker_engine, denied.run_id)

        # handed to uid 1000 (what the message says to do): the steps run in containers as that user
        _chown(workspace, 1000, 1000)
        first = _materialize([foundation_model], tiny_config, launcher, instance)
        assert first.success, _failure(first)
        scored = _materialize([scenario_model, predictions], tiny_config, launcher, instance, "churn")
        assert scored.success, _failure(scored)
        for run in (first, scored):
            assert not _leftover(docker_engine, run.run_id)  # removed after success

        mats = [
            *first.asset_materializations_for_node("foundation_model"),
            *scored.asset_materializations_for_node("scenario_model"),
            *scored.asset_materializations_for_node("predictions"),
        ]
        assert len(mats) == 3
        for mat in mats:  # metadata came back through Pipes from inside the container
            meta = {k: v.value for k, v in mat.metadata.items()}
            assert "step.in_container" in meta, sorted(meta)
            assert meta["step.in_container"] is True and meta["step.user"] == "1000:1000"
            assert meta["step.forwarded_env"] == [SECRET_NAME]  # the secret reached the step, by name only
        # the artifacts are on the host, written by the container's user
        checkpoints = workspace / "checkpoints"
        assert (checkpoints / "foundation" / "LATEST").read_text().strip()
        assert (checkpoints / "scenarios" / "churn" / "LATEST").read_text().strip()
        written = list((workspace / "predictions" / "churn").rglob("*.parquet"))
        assert written and all(p.stat().st_uid == 1000 for p in written)

        # a step that fails inside its container: the user's message, and the container is removed too
        bad = _materialize([scenario_model], tiny_config, launcher, instance, "no_such_scenario")
        assert not bad.success
        assert "unknown scenario 'no_such_scenario'" in _failure(bad)
        assert not _leftover(docker_engine, bad.run_id)

        # the secret's value is nowhere in what Dagster stored: event log, metadata, step logs
        for run in (first, scored, bad):
            for record in instance.all_logs(run.run_id):
                assert token not in str(record)
        logs = Path(instance.root_directory) / "storage"
        for path in logs.rglob("*") if logs.exists() else []:
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
    shutil.rmtree(workspace / ".pipes", ignore_errors=True)
