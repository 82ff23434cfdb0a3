"""The launcher's container specs as data, checked with each backend's own client code (no engine here):
docker's create-args builder, dagster-k8s's pod builder and botocore's RunTask parameter validator; and
data-parallel pretraining under torchrun through Pipes (two CPU processes)."""

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator
from dagster_k8s.pipes import build_pod_body
from docker.models.containers import _create_container_args

from basemodel_pipeline import files as fs
from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.models.assets import foundation_model
from basemodel_pipeline.defs.shared.gpu_devices import reserve_devices
from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.defs.shared.permissions import unwritable_dir
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource, launcher_from_env
from basemodel_pipeline.pipeline import run_cache, run_extract

RUN_ID = "0f9e8d7c-1111-2222-3333-444455556666"


@pytest.fixture
def gpu_launcher(monkeypatch: pytest.MonkeyPatch) -> Launcher:
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "s3cret")
    return Launcher(
        backend="docker",
        image="registry.example/basemodel-trainer:1.0",
        workspace_dir="/srv/basemodel",
        gpus=2,
        env={"PYTHONHASHSEED": "0"},
        forward_env=["WAREHOUSE_PASSWORD", "NOT_SET_ANYWHERE"],
        docker_network="basemodel",
        k8s_namespace="ml",
        k8s_pvc="basemodel-workspace",
        ecs_cluster="ml-cluster",
        ecs_task_definition="basemodel-trainer:3",
        ecs_subnets=["subnet-1"],
        ecs_security_groups=["sg-1"],
    )


def test_command_is_the_same_entrypoint_everywhere(gpu_launcher: Launcher) -> None:
    args = ["--scenario", "churn"]
    assert gpu_launcher.command("finetune", "/srv/basemodel/config.yaml", args) == [
        "python",
        "-m",
        "basemodel_pipeline.entrypoints.finetune",
        "--config",
        "/srv/basemodel/config.yaml",
        *args,
    ]
    local = Launcher(backend="subprocess").command("pretrain", "/c.yaml")
    assert local[0] == sys.executable and local[1:3] == ["-m", "basemodel_pipeline.entrypoints.pretrain"]


def test_docker_spec(gpu_launcher: Launcher) -> None:
    spec = gpu_launcher.docker_spec(RUN_ID, "foundation_model", "pretrain")
    args = _create_container_args(
        {"image": gpu_launcher.image, "command": ["python"], "version": "1.45", **spec}
    )
    host = args["host_config"]
    assert host["DeviceRequests"] == [
        {"Driver": "", "Count": 2, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert host["Binds"] == ["/srv/basemodel:/srv/basemodel:rw"]  # same path in host and container
    assert host["NetworkMode"] == "basemodel" and host["ShmSize"] == 8 * 1024**3
    assert args["user"] == "1000:1000" and args["working_dir"] == "/srv/basemodel"
    assert args["labels"]["dagster/run_id"] == RUN_ID and args["labels"]["basemodel/job"] == "pretrain"
    one = gpu_launcher.docker_spec(RUN_ID, "scenario_model", "finetune")["device_requests"][0]
    assert one["Count"] == 1  # scenario steps use one of the GPUs
    assert args["environment"] == {  # the forwarded names travel too, so the step can say what it received
        "PYTHONHASHSEED": "0",
        "BASEMODEL_FORWARDED_ENV": "WAREHOUSE_PASSWORD",
        "WAREHOUSE_PASSWORD": "s3cret",
    }
    cpu = Launcher(backend="docker").docker_spec(RUN_ID, "x", "predict")
    assert "device_requests" not in cpu and "volumes" not in cpu


def test_k8s_pod(gpu_launcher: Launcher) -> None:
    meta, spec = gpu_launcher.k8s_pod(RUN_ID, "scenario_model[churn]", "pretrain")
    pod = build_pod_body(
        "basemodel-x", gpu_launcher.image, ["python", "-m", "x"], {"DAGSTER_PIPES_CONTEXT": "c"}, meta, spec
    )
    (container,) = pod.spec.containers
    assert container.image == gpu_launcher.image and container.command == ["python", "-m", "x"]
    assert container.resources.limits == {"nvidia.com/gpu": "2"}
    assert container.volume_mounts[0].mount_path == "/srv/basemodel"
    assert pod.spec.volumes[0].persistent_volume_claim.claim_name == "basemodel-workspace"
    assert pod.spec.security_context.run_as_user == 1000 and container.security_context.run_as_non_root
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.tolerations[0].key == "nvidia.com/gpu"
    assert pod.metadata.labels["dagster_run_id"] == RUN_ID
    assert pod.metadata.labels["dagster_step_key"] == "scenario_model_churn"
    env = {e.name: e.value for e in container.env}
    assert env["WAREHOUSE_PASSWORD"] == "s3cret" and env["DAGSTER_PIPES_CONTEXT"] == "c"


def test_ecs_run_task_params(gpu_launcher: Launcher) -> None:
    command = gpu_launcher.command("pretrain", "/srv/basemodel/config.yaml")
    params = gpu_launcher.ecs_spec(RUN_ID, "foundation_model", "pretrain", command)
    shape = get_session().get_service_model("ecs").operation_model("RunTask").input_shape
    report = ParamValidator().validate(params, shape)
    assert not report.has_errors(), report.generate_report()
    (override,) = params["overrides"]["containerOverrides"]
    assert override["resourceRequirements"] == [{"type": "GPU", "value": "2"}]
    assert override["command"] == command and override["name"] == "trainer"
    assert {"key": "dagster/run_id", "value": RUN_ID} in params["tags"]
    assert params["networkConfiguration"]["awsvpcConfiguration"]["subnets"] == ["subnet-1"]


def test_launcher_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_LAUNCHER", "k8s")
    monkeypatch.setenv("BASEMODEL_GPUS", "1")
    monkeypatch.setenv("BASEMODEL_K8S_PVC", "ws")
    monkeypatch.setenv("BASEMODEL_WORKSPACE_DIR", "/ws")
    monkeypatch.setenv("BASEMODEL_FORWARD_ENV", "A, B")
    launcher = launcher_from_env("prod")
    assert (launcher.backend, launcher.gpus, launcher.k8s_pvc, launcher.workspace_dir) == (
        "k8s",
        1,
        "ws",
        "/ws",
    )
    assert launcher.forward_env == ["A", "B"] and launcher.termination_timeout_seconds == 120
    monkeypatch.setenv("BASEMODEL_LAUNCHER", "subprocess")
    assert launcher_from_env("ci").env == {"CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}


def test_data_parallel_stages_run_under_torchrun(gpu_launcher: Launcher) -> None:
    command = gpu_launcher.command("pretrain", "/c.yaml")
    assert command[:5] == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert command[5:] == ["-m", "basemodel_pipeline.entrypoints.pretrain", "--config", "/c.yaml"]
    assert gpu_launcher.command("finetune", "/c.yaml")[:3] == [
        "python",
        "-m",
        "basemodel_pipeline.entrypoints.finetune",
    ]
    assert Launcher(backend="docker", gpus=1).processes("pretrain") == 1


@pytest.mark.timeout(1800)
def test_pretrain_under_torchrun_reports_once_through_pipes(tiny_config: Path) -> None:
    """Two CPU processes (gloo) train one foundation; rank 0 alone speaks Pipes: one materialization."""
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    launcher = Launcher(
        backend="subprocess", nproc=2, env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [foundation_model],
            instance=instance,
            resources={
                "basemodel_config": BasemodelConfigResource(config_path=str(tiny_config)),
                "launcher": launcher,
            },
        )
    assert result.success
    (mat,) = result.asset_materializations_for_node("foundation_model")
    assert math.isfinite(mat.metadata["val_loss"].value)
    assert fs.versions(tiny_config.parent / "checkpoints" / "foundation") == [mat.metadata["version"].value]


def test_container_user_follows_the_workspace_owner(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory another owner")
    ws = tmp_path / "ws"
    (ws / "checkpoints" / "foundation").mkdir(parents=True)
    launcher = Launcher(backend="docker", workspace_dir=str(ws))
    assert launcher.container_user() == "1000:1000"  # root-owned: the image's user, never root
    for path in (ws, ws / "checkpoints", ws / "checkpoints" / "foundation"):
        os.chown(path, 1234, 1234)
    assert launcher.container_user() == "1234:1234"
    assert launcher.docker_spec(RUN_ID, "x", "pretrain")["user"] == "1234:1234"
    launcher.check_workspace_writable()  # its owner can write it
    assert Launcher(backend="docker", workspace_dir=str(ws), user="42:42").container_user() == "42:42"


def test_unwritable_workspace_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "checkpoints" / "scenarios").mkdir(parents=True)
    (ws / "data").mkdir()  # not written by steps: its owner does not matter
    for path in (ws, ws / "checkpoints", ws / "checkpoints" / "scenarios", ws / "data"):
        path.chmod(0o755)
    uid = os.stat(ws).st_uid + 1  # someone else
    assert unwritable_dir(ws, uid, uid) == ws
    ws.chmod(0o777)
    assert unwritable_dir(ws, uid, uid) == ws / "checkpoints"
    (ws / "checkpoints").chmod(0o777)
    (ws / "checkpoints" / "scenarios").chmod(0o777)
    assert unwritable_dir(ws, uid, uid) is None  # data/ is not checked
    (ws / "checkpoints" / "scenarios").chmod(0o755)
    launcher = Launcher(backend="docker", workspace_dir=str(ws), user=f"{uid}:{uid}")
    with pytest.raises(dg.Failure) as err:
        launcher.check_workspace_writable()
    message = err.value.description or ""
    assert f"cannot write {ws / 'checkpoints' / 'scenarios'}" in message
    assert f"chown -R {uid}:{uid} {ws}" in message and "\n" not in message
    with pytest.raises(dg.Failure, match="never runs as root"):
        Launcher(backend="docker", workspace_dir=str(ws), user="0:0").check_workspace_writable()
    with pytest.raises(dg.Failure, match="does not exist"):
        Launcher(
            backend="docker", workspace_dir=str(tmp_path / "nope"), user="5:5"
        ).check_workspace_writable()
    Launcher(backend="subprocess", workspace_dir=str(ws)).check_workspace_writable()  # host steps: no check


def test_concurrent_one_gpu_steps_get_distinct_devices(tmp_path: Path) -> None:
    """Docker's `count` would give every step GPU 0: steps reserve device ids instead (lock files)."""
    locks = tmp_path / ".gpu-locks"
    devices = ["0", "1"]
    with reserve_devices(locks, devices, 1) as a, reserve_devices(locks, devices, 1) as b:
        assert sorted(a + b) == ["0", "1"]
        # a third step (another thread, as another run worker would be) waits until one is released
        got: list[list[str]] = []
        waiting: list[str] = []

        def third() -> None:
            with reserve_devices(locks, devices, 1, log=waiting.append, poll_s=0.05) as ids:
                got.append(ids)

        thread = threading.Thread(target=third)
        thread.start()
        time.sleep(0.3)
        assert not got and waiting and "waiting for 1 free GPU(s)" in waiting[0]
    thread.join(5)
    assert got and got[0][0] in devices
    # data-parallel pretraining takes all of them; asking for more than there are is an error
    with reserve_devices(locks, devices, 2) as both:
        assert both == ["0", "1"]
    with pytest.raises(ValueError, match="3 GPUs asked for"), reserve_devices(locks, devices, 3):
        pass


def test_a_killed_holder_frees_its_gpu(tmp_path: Path) -> None:
    locks = tmp_path / ".gpu-locks"
    code = (
        "import sys, time; from pathlib import Path; from basemodel_pipeline.defs.shared.gpu_devices import reserve_devices\n"
        f"with reserve_devices(Path({str(locks)!r}), ['0'], 1):\n    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with reserve_devices(locks, ["0"], 1) as ids:  # the lock died with its process
        assert ids == ["0"]


def test_docker_spec_with_reserved_devices(gpu_launcher: Launcher) -> None:
    spec = gpu_launcher.docker_spec(RUN_ID, "scenario_model", "finetune", device_ids=["1"])
    args = _create_container_args(
        {"image": gpu_launcher.image, "command": ["python"], "version": "1.45", **spec}
    )
    (request,) = args["host_config"]["DeviceRequests"]
    assert request["DeviceIDs"] == ["1"] and request["Count"] == 0 and request["Capabilities"] == [["gpu"]]
    assert gpu_launcher.devices() == ["0", "1"]
    assert Launcher(gpus=1, gpu_devices=["3"]).devices() == ["3"]
