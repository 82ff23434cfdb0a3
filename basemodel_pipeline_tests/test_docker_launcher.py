"""The docker launcher end to end on a real Docker engine: each training and scoring step runs in the CPU
trainer image through dagster-docker's PipesDockerClient, with the workspace bind-mounted at the same path.

Needs the project's local engine and images (`deploy/local-engine.sh start && deploy/local-engine.sh images`,
as root; .ci/run does it where it runs as root); skipped with that instruction when no engine answers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import dagster as dg
import pytest
from conftest import chown_tree

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
from basemodel_pipeline.defs.predictions.assets import predictions
from basemodel_pipeline.defs.shared.containers import (
    RUN_ID_LABEL,
    remove_run_containers,
    remove_step_containers,
)
from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource, QualityGates
from basemodel_pipeline.pipeline import run_cache, run_extract

pytestmark = pytest.mark.timeout(1800)

IMAGE = "basemodel-trainer:latest"
CUDA_IMAGE = "basemodel-trainer-cuda:latest"  # deploy/local-engine.sh cuda-trainer
BASE_IMAGE = "local/debian-python:bookworm"  # deploy/local-engine.sh
SECRET_NAME = "BASEMODEL_TEST_WAREHOUSE_TOKEN"


def _materialize(assets, config: Path, launcher: Launcher, instance, partition: str | None = None):
    return dg.materialize(
        assets,
        instance=instance,
        resources={
            "launcher": launcher,
            "basemodel_config": BasemodelConfigResource(config_path=str(config)),
            "quality_gates": QualityGates(),  # the config's gates (the tiny config's let its models through)
        },
        partition_key=partition,
        raise_on_error=False,
    )


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
        chown_tree(workspace, 1000, 1000)
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
    assert not (workspace / ".pipes").exists(), "the launcher shares no error file with its steps any more"


def test_a_step_removes_only_its_own_trainer_containers(docker_engine) -> None:
    """DockerRunLauncher labels the run worker with the same dagster/run_id as the trainer containers: the
    step's cleanup must leave it (and the run's other steps) alone; the end-of-run cleanup removes all."""
    docker_engine.require(BASE_IMAGE)
    run_id = f"test-{secrets.token_hex(6)}"
    client = docker_engine.client

    def start(labels: dict[str, str]):
        return client.containers.run(
            BASE_IMAGE, ["sleep", "300"], labels=labels, detach=True, network_mode="host"
        )

    worker = start(
        {RUN_ID_LABEL: run_id, "dagster/job_name": "refresh_and_train"}
    )  # as DockerRunLauncher does
    launcher = Launcher(backend="docker")
    mine = start(launcher.labels(run_id, "scenario_model", "finetune"))
    other_step = start(launcher.labels(run_id, "foundation_model", "pretrain"))
    try:
        assert remove_step_containers(run_id, "scenario_model", client) == [mine.id]
        alive = {
            c.id for c in client.containers.list(all=True, filters={"label": f"{RUN_ID_LABEL}={run_id}"})
        }
        assert alive == {worker.id, other_step.id}
        assert sorted(remove_run_containers(run_id, client)) == sorted([worker.id, other_step.id])
        assert not client.containers.list(all=True, filters={"label": f"{RUN_ID_LABEL}={run_id}"})
    finally:
        for c in (worker, mine, other_step):
            with contextlib.suppress(Exception):
                c.remove(force=True)


def test_engine_image_and_gpu_problems_are_one_line_each(
    docker_engine, tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No engine, a missing image, GPUs on an engine without a GPU runtime: each fails the step at once
    with one line that says what to do, and leaves no container."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test hands the workspace to the container's uid")
    docker_engine.require(IMAGE)
    workspace = tiny_config.parent
    chown_tree(workspace, 1000, 1000)
    base = {"backend": "docker", "image": IMAGE, "workspace_dir": str(workspace), "docker_network": "host"}
    with dg.instance_for_test() as instance:

        def failure(launcher: Launcher) -> str:
            result = _materialize([foundation_model], tiny_config, launcher, instance)
            assert not result.success
            assert not _leftover(docker_engine, result.run_id)
            message = _failure(result)
            assert "\n" not in message and "Traceback" not in message
            return message

        gpu = failure(Launcher(**base, gpus=1))
        assert "BASEMODEL_GPUS=1 asks for GPUs" in gpu and "BASEMODEL_GPUS=0" in gpu
        missing = failure(Launcher(**{**base, "image": "localhost:1/basemodel-none:never"}))
        assert "localhost:1/basemodel-none:never is not on the Docker engine" in missing
        assert "BASEMODEL_TRAINER_IMAGE" in missing
        monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        down = failure(Launcher(**base))
        assert "no Docker engine answers at unix:///nonexistent/docker.sock" in down


def test_trainer_image_holds_the_runtime_only(docker_engine) -> None:
    """The images install requirements-runtime.lock: the library and its connectors, no test packages."""
    docker_engine.require(IMAGE)
    code = (
        "import importlib.util as u; import basemodel_pipeline, lightgbm, torch, snowflake.connector; "
        "print(','.join(m for m in ('pyspark', 'pytest', 'moto', 'fakesnow', 'chdb') if u.find_spec(m)) or 'none', "
        "torch.__version__)"
    )
    out = docker_engine.client.containers.run(IMAGE, ["python", "-c", code], remove=True, network_mode="host")
    found, torch_version = out.decode().split()
    assert found == "none" and torch_version.startswith("2.13.0")


def test_the_cuda_trainer_carries_cuda_torch_and_the_same_entrypoints(docker_engine) -> None:
    """The GPU trainer (`deploy/local-engine.sh cuda-trainer`: same Dockerfile, PyPI's CUDA build of the pinned
    torch) holds a CUDA torch with its runtime libraries, the project's entrypoints and no test packages. Without
    a GPU here it must report no device, not fail to load CUDA's libraries. Skips where the image was not built
    (several GB of downloads: not part of `images` or CI)."""
    docker_engine.require(CUDA_IMAGE)
    code = (
        "import importlib.util as u, torch, basemodel_pipeline.entrypoints.finetune; "
        "print(','.join(m for m in ('pytest', 'moto', 'fakesnow') if u.find_spec(m)) or 'none', "
        "torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.backends.cudnn.is_available())"
    )
    out = docker_engine.client.containers.run(
        CUDA_IMAGE, ["python", "-c", code], remove=True, network_mode="host"
    )
    found, version, cuda, available, cudnn = out.decode().split()
    assert found == "none" and version.startswith("2.13.0") and "+cu" in version
    assert cuda != "None" and cudnn == "True" and available == "False"
