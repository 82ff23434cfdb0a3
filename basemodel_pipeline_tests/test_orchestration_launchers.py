"""The launcher's container specs as data, checked with each backend's own client code (no engine here):
docker's create-args builder, dagster-k8s's pod builder and botocore's RunTask parameter validator; and
data-parallel pretraining under torchrun through Pipes (two CPU processes)."""

import math
import os
import sys
from pathlib import Path

import dagster as dg
import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator
from dagster_k8s.pipes import build_pod_body
from docker.models.containers import _create_container_args

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.launcher import Launcher, remove_run_containers, unwritable_dir
from basemodel_pipeline.defs.models.assets import foundation_model
from basemodel_pipeline.defs.resources import BasemodelConfigResource, launcher_from_env
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
        "basemodel_pipeline.jobs.finetune",
        "--config",
        "/srv/basemodel/config.yaml",
        *args,
    ]
    local = Launcher(backend="subprocess").command("pretrain", "/c.yaml")
    assert local[0] == sys.executable and local[1:3] == ["-m", "basemodel_pipeline.jobs.pretrain"]


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


class _Container:
    def __init__(self, cid: str, removed: list[str]) -> None:
        self.id, self._removed = cid, removed

    def remove(self, force: bool = False) -> None:
        assert force  # a running container is stopped and removed
        self._removed.append(self.id)


class _Containers:
    """The part of docker's client that remove_run_containers uses (no engine runs here)."""

    def __init__(self, by_run: dict[str, list[str]]) -> None:
        self.by_run, self.removed, self.filters = by_run, [], []

    def list(self, all: bool, filters: dict[str, str]) -> list[_Container]:
        assert all  # stopped containers too
        self.filters.append(filters)
        run_id = filters["label"].split("=", 1)[1]
        return [_Container(c, self.removed) for c in self.by_run.get(run_id, [])]


def test_remove_run_containers_by_label() -> None:
    containers = _Containers({RUN_ID: ["c1", "c2"], "other": ["c3"]})
    client = type("Client", (), {"containers": containers})()
    assert remove_run_containers(RUN_ID, client) == ["c1", "c2"]
    assert containers.filters == [{"label": f"dagster/run_id={RUN_ID}"}] and containers.removed == [
        "c1",
        "c2",
    ]


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
    assert command[5:] == ["-m", "basemodel_pipeline.jobs.pretrain", "--config", "/c.yaml"]
    assert gpu_launcher.command("finetune", "/c.yaml")[:3] == [
        "python",
        "-m",
        "basemodel_pipeline.jobs.finetune",
    ]
    assert Launcher(backend="docker", gpus=1).processes("pretrain") == 1


@pytest.mark.timeout(400)
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
    versions = [
        p
        for p in (tiny_config.parent / "checkpoints" / "foundation").iterdir()
        if p.is_dir() and not p.name.startswith(".")
    ]
    assert [p.name for p in versions] == [mat.metadata["version"].value]


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
