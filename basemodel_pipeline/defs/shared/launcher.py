"""One launcher resource for the training and scoring steps; the backend is chosen per environment.

    subprocess  ``python -m basemodel_pipeline.entrypoints.<stage>`` next to the run worker (local, CI; CPU or the
                machine's GPUs)
    docker      a container of the trainer image per step (dagster-docker PipesDockerClient): GPUs through
                ``device_requests``, the workspace volume mounted at the same path as on the host, labels
                with the run id, the container removed after success, failure or cancellation
    k8s         a pod per step (dagster-k8s PipesK8sClient): ``nvidia.com/gpu`` limits, the workspace as a
                PersistentVolumeClaim at the same path, run-id labels, the pod deleted when done
    ecs         a task per step (dagster-aws PipesECSClient): GPU resource requirements, run-id tags

Every backend runs the same entrypoint with the same arguments (the foundation's pretrain under torchrun,
one process per GPU, when a step has several GPUs); what each sends to its API is built by a
``*_spec`` method and tested as data. Training writes only to the POSIX workspace volume: uploading to
object storage is a separate step (basemodel_pipeline.ops.upload).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from basemodel_pipeline.defs.shared.containers import (
    MANAGED_LABEL,
    RUN_ID_LABEL,
    STAGE_LABEL,
    STEP_LABEL,
    label_value,
    remove_step_containers,
)
from basemodel_pipeline.defs.shared.gpu_devices import reserve_devices
from basemodel_pipeline.defs.shared.permissions import unwritable_dir
from basemodel_pipeline.defs.shared.step_failures import raise_step_failure
from basemodel_pipeline.metadata import FORWARDED_ENV_VAR

Backend = Literal["subprocess", "docker", "k8s", "ecs"]
BACKENDS: tuple[str, ...] = ("subprocess", "docker", "k8s", "ecs")
K8S_CONTAINER = "dagster-pipes-execution"
# Stages that train data-parallel under torchrun (training/distributed.py); the others use one process.
DATA_PARALLEL_STAGES = frozenset({"pretrain"})
# Stages that never use a GPU: a scenario's baselines (LightGBM, popularity) run on CPUs only.
CPU_STAGES = frozenset({"baselines"})
DEFAULT_USER = "1000:1000"  # the `basemodel` user of deploy/Dockerfile


class Launcher(dg.ConfigurableResource):
    """Runs a Pipes entrypoint of basemodel_pipeline.entrypoints on the configured backend."""

    backend: Backend = "subprocess"
    image: str = Field(default="basemodel-trainer:latest", description="Trainer image (container backends).")
    workspace_dir: str = Field(
        default="",
        description="Workspace path, mounted at the same path in the container (docker: host path; "
        "k8s: mount path of the PVC; ecs: the task definition's mount point).",
    )
    gpus: int = Field(default=0, ge=0, description="GPUs per step (0: CPU).")
    gpu_devices: list[str] = Field(
        default_factory=list,
        description="docker: the host's GPU ids that steps reserve one by one (default 0 .. gpus-1): "
        "concurrent one-GPU steps each get a distinct device (defs/shared/gpu_devices.py).",
    )
    nproc: int = Field(
        default=0,
        ge=0,
        description="torchrun processes for data-parallel stages (pretrain); 0: one per GPU when gpus > 1.",
    )
    user: str = Field(
        default="",
        description="uid:gid the container runs as (never root); empty: the owner of the workspace directory "
        "when that is not root, else 1000:1000 (the image's `basemodel` user).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Plain settings for the step.")
    forward_env: list[str] = Field(
        default_factory=list,
        description="Names of environment variables (secrets) passed on from the run worker by value.",
    )
    docker_network: str = ""
    shm_size: str = "8g"
    k8s_namespace: str = "default"
    k8s_pvc: str = Field(default="", description="PersistentVolumeClaim holding the workspace.")
    k8s_node_selector: dict[str, str] = Field(default_factory=dict)
    ecs_cluster: str = ""
    ecs_task_definition: str = ""
    ecs_container: str = "trainer"
    ecs_subnets: list[str] = Field(default_factory=list)
    ecs_security_groups: list[str] = Field(default_factory=list)
    termination_timeout_seconds: int = 120

    # ------------------------------------------------------------------ specs (pure data)

    def container_user(self) -> str:
        """uid:gid of the step's container: `user`, else the workspace directory's owner unless that is root,
        else the image's own user 1000:1000."""
        if self.user:
            return self.user
        if self.workspace_dir:
            try:
                st = os.stat(self.workspace_dir)
            except OSError:
                return DEFAULT_USER
            if st.st_uid != 0:
                return f"{st.st_uid}:{st.st_gid}"
        return DEFAULT_USER

    def container_ids(self) -> tuple[int, int]:
        """(uid, gid) of `container_user()`; gid defaults to uid. One line when they are not numbers."""
        user = self.container_user()
        uid, _, gid = user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise dg.Failure(
                description=f"container user {user!r} is not uid:gid in numbers (BASEMODEL_CONTAINER_USER)",
                allow_retries=False,
            )
        return int(uid), int(gid or uid)

    def check_workspace_writable(self) -> None:
        """Fail before a container starts when its user cannot write the mounted workspace (one line that
        says what to do), instead of a PermissionError deep inside the step."""
        if self.backend != "docker" or not self.workspace_dir:
            return
        uid, gid = self.container_ids()
        if uid == 0:
            raise dg.Failure(
                description="the trainer container never runs as root: set BASEMODEL_CONTAINER_USER to the "
                "uid:gid that owns the workspace",
                allow_retries=False,
            )
        root = Path(self.workspace_dir)
        if not root.is_dir():
            raise dg.Failure(
                description=f"workspace {root} (BASEMODEL_WORKSPACE_DIR) does not exist on this host: create "
                "it or set BASEMODEL_WORKSPACE_DIR to the workspace the config uses",
                allow_retries=False,
            )
        blocked = unwritable_dir(root, uid, gid)
        if blocked is not None:
            st = blocked.stat()
            raise dg.Failure(
                description=f"the trainer container runs as {self.container_user()}, which cannot write "
                f"{blocked} (owned by {st.st_uid}:{st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}): give it the "
                f"workspace with `chown -R {uid}:{gid} {root}`, or set BASEMODEL_CONTAINER_USER to the uid:gid that "
                "owns the workspace (not 0)",
                allow_retries=False,
            )

    def gpus_for(self, stage: str) -> int:
        """GPUs a step gets: all `gpus` for data-parallel stages, none for CPU stages, at most one otherwise."""
        if stage in CPU_STAGES:
            return 0
        return self.gpus if stage in DATA_PARALLEL_STAGES else min(self.gpus, 1)

    def processes(self, stage: str) -> int:
        """torchrun processes for the step: data-parallel stages get one per GPU (or `nproc`)."""
        if stage not in DATA_PARALLEL_STAGES:
            return 1
        return self.nproc or max(self.gpus, 1)

    def command(self, stage: str, config_path: str, args: Sequence[str] = ()) -> list[str]:
        python = sys.executable if self.backend == "subprocess" else "python"
        entry = ["-m", f"basemodel_pipeline.entrypoints.{stage}", "--config", config_path, *args]
        n = self.processes(stage)
        if n > 1:  # torchrun: one process per GPU, rank 0 speaks Pipes
            return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *entry]
        return [python, *entry]

    def step_env(self) -> dict[str, str]:
        """Settings plus the forwarded variables' current values (never logged, never in metadata)."""
        forwarded = {name: os.environ[name] for name in self.forward_env if name in os.environ}
        names = {FORWARDED_ENV_VAR: ",".join(sorted(forwarded))} if forwarded else {}
        return {**self.env, **names, **forwarded}

    def labels(self, run_id: str, step_key: str, stage: str) -> dict[str, str]:
        return {
            RUN_ID_LABEL: run_id,
            STEP_LABEL: label_value(step_key),
            STAGE_LABEL: stage,
            MANAGED_LABEL: "true",
        }

    def devices(self) -> list[str]:
        """The GPU ids docker steps reserve from (BASEMODEL_GPU_DEVICES, else 0 .. gpus-1)."""
        return list(self.gpu_devices) or [str(i) for i in range(self.gpus)]

    def docker_spec(
        self, run_id: str, step_key: str, stage: str, device_ids: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """``container_kwargs`` for PipesDockerClient.run (passed on to docker's containers.create); with
        `device_ids` (reserved by the step) those GPUs, else the first `gpus_for(stage)`."""
        from docker.types import DeviceRequest

        spec: dict[str, Any] = {
            "labels": self.labels(run_id, step_key, stage),
            "user": self.container_user(),
            "environment": self.step_env(),
            "shm_size": self.shm_size,
        }
        if self.workspace_dir:
            spec["volumes"] = {self.workspace_dir: {"bind": self.workspace_dir, "mode": "rw"}}
            spec["working_dir"] = self.workspace_dir
        if self.gpus_for(stage):
            if device_ids:
                request = DeviceRequest(device_ids=list(device_ids), capabilities=[["gpu"]])
            else:
                request = DeviceRequest(count=self.gpus_for(stage), capabilities=[["gpu"]])
            spec["device_requests"] = [request]
        if self.docker_network:
            spec["network"] = self.docker_network
        return spec

    def k8s_pod(self, run_id: str, step_key: str, stage: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(base_pod_meta, base_pod_spec) for PipesK8sClient.run."""
        uid, gid = self.container_ids()
        container: dict[str, Any] = {
            "name": K8S_CONTAINER,
            "image": self.image,
            "env": [{"name": k, "value": v} for k, v in sorted(self.step_env().items())],
            "security_context": {"run_as_non_root": True, "allow_privilege_escalation": False},
        }
        spec: dict[str, Any] = {
            "containers": [container],
            "restart_policy": "Never",
            "security_context": {
                "run_as_user": uid,
                "run_as_group": gid,
                "fs_group": gid,
            },
        }
        if self.gpus_for(stage):
            container["resources"] = {"limits": {"nvidia.com/gpu": str(self.gpus_for(stage))}}
            spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if self.k8s_node_selector:
            spec["node_selector"] = dict(self.k8s_node_selector)
        if self.k8s_pvc:
            container["volume_mounts"] = [{"name": "workspace", "mount_path": self.workspace_dir}]
            spec["volumes"] = [{"name": "workspace", "persistent_volume_claim": {"claim_name": self.k8s_pvc}}]
        meta = {
            "labels": {
                label_value(k): label_value(v) for k, v in self.labels(run_id, step_key, stage).items()
            }
        }
        return meta, spec

    def ecs_spec(self, run_id: str, step_key: str, stage: str, command: Sequence[str]) -> dict[str, Any]:
        """``run_task_params`` for PipesECSClient.run (boto3 ecs.run_task arguments)."""
        override: dict[str, Any] = {
            "name": self.ecs_container,
            "command": list(command),
            "environment": [{"name": k, "value": v} for k, v in sorted(self.step_env().items())],
        }
        if self.gpus_for(stage):
            override["resourceRequirements"] = [{"type": "GPU", "value": str(self.gpus_for(stage))}]
        params: dict[str, Any] = {
            "cluster": self.ecs_cluster,
            "taskDefinition": self.ecs_task_definition,
            "count": 1,
            "overrides": {"containerOverrides": [override]},
            "tags": [{"key": k, "value": v} for k, v in self.labels(run_id, step_key, stage).items()],
            "propagateTags": "TASK_DEFINITION",
        }
        if self.ecs_subnets:  # awsvpc networking (Fargate or EC2 with awsvpc)
            params["networkConfiguration"] = {
                "awsvpcConfiguration": {
                    "subnets": list(self.ecs_subnets),
                    "securityGroups": list(self.ecs_security_groups),
                    "assignPublicIp": "DISABLED",
                }
            }
        return params

    # ------------------------------------------------------------------ running

    def docker_preflight(self) -> Any:
        """A client of an engine that answers and holds (or can pull) the trainer image; else one line
        that says what to do, before any container exists."""
        import docker

        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            client = docker.from_env()
            client.ping()
        except docker.errors.DockerException as err:
            raise dg.Failure(
                description=f"no Docker engine answers at {where} ({type(err).__name__}): start one "
                "(`deploy/local-engine.sh start`, or the system's dockerd) or point DOCKER_HOST at it",
                allow_retries=False,
            ) from None
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound:
            try:
                client.images.pull(self.image)
            except docker.errors.DockerException as err:
                reason = str(getattr(err, "explanation", "") or err).splitlines()[0][:200]
                raise dg.Failure(
                    description=f"the trainer image {self.image} is not on the Docker engine at {where} and "
                    f"could not be pulled ({reason}): build it (`deploy/local-engine.sh images`, or `docker "
                    "compose --profile gpu build trainer`) or set BASEMODEL_TRAINER_IMAGE to an image the "
                    "engine has (`docker image ls`)",
                    allow_retries=False,
                ) from None
        return client

    @contextmanager
    def _reserved_gpus(self, stage: str, context: dg.AssetExecutionContext) -> Iterator[list[str]]:
        """Distinct device ids for this step while it runs (none for CPU steps)."""
        count = self.gpus_for(stage)
        if not count:
            yield []
            return
        base = Path(self.workspace_dir) if self.workspace_dir else Path(tempfile.gettempdir())
        with reserve_devices(base / ".gpu-locks", self.devices(), count, log=context.log.info) as ids:
            context.log.info(f"GPU(s) {', '.join(ids)} reserved for this step")
            yield ids

    def _no_gpu_message(self, client: Any) -> str:
        return (
            f"BASEMODEL_GPUS={self.gpus} asks for GPUs, but the Docker engine ({client.api.base_url}) has no GPU "
            "runtime: install the NVIDIA driver and the NVIDIA container toolkit on that host, or set "
            "BASEMODEL_GPUS=0 to train on CPUs"
        )

    def run(
        self, context: dg.AssetExecutionContext, stage: str, config_path: str, args: Sequence[str] = ()
    ) -> dg.PipesClientCompletedInvocation:
        """Run the entrypoint; a UserError in it fails the step with the user's one-line message."""
        command = self.command(stage, config_path, args)
        self.check_workspace_writable()
        try:
            return self._launch(context, stage, command, {})
        except Exception as err:
            raise_step_failure(context, stage, err)  # a user's one line, or a crash retried once
            raise

    def _launch(
        self, context: dg.AssetExecutionContext, stage: str, command: list[str], extras: Mapping[str, Any]
    ) -> dg.PipesClientCompletedInvocation:
        run_id, step_key = context.run.run_id, str(context.op_handle)
        if self.backend == "subprocess":
            client = dg.PipesSubprocessClient(
                env=self.step_env(),
                forward_termination=True,
                termination_timeout_seconds=self.termination_timeout_seconds,
            )
            return client.run(context=context, command=command, extras=extras)
        if self.backend == "docker":
            import docker
            from dagster_docker import PipesDockerClient

            client = self.docker_preflight()
            try:
                with self._reserved_gpus(stage, context) as device_ids:
                    return PipesDockerClient().run(
                        context=context,
                        image=self.image,
                        command=command,
                        extras=extras,
                        container_kwargs=self.docker_spec(run_id, step_key, stage, device_ids),
                    )
            except docker.errors.APIError as err:
                if "could not select device driver" in str(err):
                    raise dg.Failure(description=self._no_gpu_message(client), allow_retries=False) from None
                raise
            finally:  # PipesDockerClient stops its container but never removes it
                remove_step_containers(run_id, step_key, client)
        if self.backend == "k8s":
            from dagster_k8s import PipesK8sClient

            meta, spec = self.k8s_pod(run_id, step_key, stage)
            return PipesK8sClient().run(
                context=context,
                command=command,
                namespace=self.k8s_namespace,
                base_pod_meta=meta,
                base_pod_spec=spec,
                extras=extras,
            )
        from dagster_aws.pipes import PipesECSClient

        return PipesECSClient().run(
            context=context,
            run_task_params=self.ecs_spec(run_id, step_key, stage, command),  # type: ignore[arg-type]
            extras=dict(extras),
            pipes_container_name=self.ecs_container,
        )
