"""Resources, chosen per environment in this one place (env var BASEMODEL_ENV = local | ci | prod).

    local  config path from BASEMODEL_CONFIG (default demo_workspace/config.yaml, resolved when loaded);
           the only environment whose graph falls back to the demo config's shape (shape.py).
    ci     BASEMODEL_CONFIG required; steps see no GPU and a fixed hash seed (reproducible CPU runs), and
           the scenario quality gates let every finite metric through (floor 0, popularity margin -1): CI's
           tiny synthetic data cannot produce a useful model.
    prod   BASEMODEL_CONFIG required, and read again at run time (dg.EnvVar).

BASEMODEL_ENV unset means local, except in a Dagster+ deployment (DAGSTER_CLOUD_DEPLOYMENT_NAME set): prod.

The launcher backend (where training and scoring steps run) is BASEMODEL_LAUNCHER = subprocess (default) |
docker | k8s | ecs, with its settings from BASEMODEL_* variables (see `launcher_from_env`). Uploading to
object storage is on when BASEMODEL_UPLOAD_URL=s3://bucket/prefix is set (endpoint: AWS_ENDPOINT_URL_S3).

Secrets never live here: the YAML config reads them from environment variables (${VAR}) itself, steps in
containers get them by name (BASEMODEL_FORWARD_ENV) and boto3 reads AWS credentials from the environment.
"""

from pathlib import Path
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.defs.shared.launcher import BACKENDS, Launcher
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.manifests import KEY_SETTING
from basemodel_pipeline.settings import setting, setting_list

ENV_VAR = "BASEMODEL_ENV"
CONFIG_ENV_VAR = "BASEMODEL_CONFIG"
LAUNCHER_ENV_VAR = "BASEMODEL_LAUNCHER"
UPLOAD_ENV_VAR = "BASEMODEL_UPLOAD_URL"
DEFAULT_CONFIG = "demo_workspace/config.yaml"
ENVIRONMENTS = ("local", "ci", "prod")
CLOUD_DEPLOYMENT_ENV_VAR = "DAGSTER_CLOUD_DEPLOYMENT_NAME"  # set by Dagster+ in every deployment


class BasemodelConfigResource(dg.ConfigurableResource):
    """Where the pipeline's YAML config lives; assets load it when they run (never at definition time)."""

    config_path: str

    def load(self) -> PipelineConfig:
        return load_config(self.config_path)


class QualityGates(dg.ConfigurableResource):
    """Thresholds of the asset checks (set them in the launchpad's resources section or in code).

    The scenario gates live in the config's `quality_gates` section; the fields here override them for this
    deployment (None: the config's value), and reach the fine-tuning step, which judges and promotes."""

    metric_floor: float | None = Field(
        default=None,
        description="Overrides quality_gates.metric_floor: the floor of AUROC-type test metrics.",
    )
    metric_floors: dict[str, float] = Field(
        default_factory=dict,
        description="Merged over quality_gates.metric_floors: per-scenario bound of its own metric (a minimum "
        "when higher is better, a maximum when lower is better).",
    )
    popularity_margin: float | None = Field(
        default=None,
        description="Overrides quality_gates.popularity_margin: the model must beat popularity by more than this.",
    )
    min_day_ratio: float = Field(default=0.2, description="A day's rows vs the trailing median: lower bound.")
    max_day_ratio: float = Field(default=5.0, description="A day's rows vs the trailing median: upper bound.")
    volume_window_days: int = Field(default=28, gt=0, description="Days in the trailing median.")
    max_table_shrink: float = Field(
        default=0.5, description="An attribute table may lose at most this share of rows between extracts."
    )

    def overrides(self) -> dict[str, Any]:
        """The scenario-gate overrides this deployment sets (what the fine-tuning step receives)."""
        out: dict[str, Any] = {}
        if self.metric_floor is not None:
            out["metric_floor"] = self.metric_floor
        if self.popularity_margin is not None:
            out["popularity_margin"] = self.popularity_margin
        if self.metric_floors:
            out["metric_floors"] = dict(self.metric_floors)
        return out

    def args(self) -> list[str]:
        """The overrides as the finetune entrypoint's `--gates JSON` argument (none when nothing is set)."""
        import json

        overrides = self.overrides()
        return ["--gates", json.dumps(overrides, sort_keys=True)] if overrides else []


class ArtifactUploader(dg.ConfigurableResource):
    """Copies finished artifacts to object storage (basemodel_pipeline.ops.upload) through dagster-aws's S3."""

    url: str = Field(description="s3://bucket/prefix; workspace-relative paths go below it.")
    s3: S3Resource

    def upload(self, directory: str | Path, workspace: str | Path) -> dict[str, Any]:
        from basemodel_pipeline.ops.upload import upload_dir

        return upload_dir(self.s3.get_client(), Path(directory), Path(workspace), self.url)


def current_env() -> str:
    """BASEMODEL_ENV; unset: prod in a Dagster+ deployment (DAGSTER_CLOUD_DEPLOYMENT_NAME), else local."""
    env = setting(ENV_VAR, "prod" if setting(CLOUD_DEPLOYMENT_ENV_VAR) else "local")
    if env not in ENVIRONMENTS:
        raise ValueError(f"{ENV_VAR}={env!r} is not one of {', '.join(ENVIRONMENTS)}")
    return env


def config_path_from_env(env: str = "local") -> str:
    """BASEMODEL_CONFIG, always absolute; only the local environment defaults to the demo's config."""
    path = setting(CONFIG_ENV_VAR)
    if not path:
        if env != "local":
            raise ConfigError(
                f"{CONFIG_ENV_VAR} is not set: {ENV_VAR}={env} needs the path of the pipeline's YAML config "
                f"(only {ENV_VAR}=local defaults to {DEFAULT_CONFIG})"
            )
        path = DEFAULT_CONFIG
    return str(Path(path).resolve())


def forwarded_env() -> list[str]:
    """BASEMODEL_FORWARD_ENV's names, and BASEMODEL_MANIFEST_KEY when it is set: the steps in trainer
    containers write and read signed manifests too (keyed manifests, manifests.py)."""
    names = setting_list("BASEMODEL_FORWARD_ENV")
    return names + [KEY_SETTING] if setting(KEY_SETTING) and KEY_SETTING not in names else names


def launcher_from_env(env: str) -> Launcher:
    """The launcher of this environment: BASEMODEL_LAUNCHER and its BASEMODEL_* settings."""
    backend = setting(LAUNCHER_ENV_VAR, "subprocess")
    if backend not in BACKENDS:
        raise ValueError(f"{LAUNCHER_ENV_VAR}={backend!r} is not one of {', '.join(BACKENDS)}")
    settings = {"CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"} if env == "ci" else {}
    get = setting
    return Launcher(
        backend=backend,  # type: ignore[arg-type]
        image=get("BASEMODEL_TRAINER_IMAGE", "basemodel-trainer:latest"),
        workspace_dir=get("BASEMODEL_WORKSPACE_DIR", ""),
        gpus=int(get("BASEMODEL_GPUS", "0")),
        nproc=int(get("BASEMODEL_NPROC", "0")),
        gpu_devices=setting_list("BASEMODEL_GPU_DEVICES"),
        env=settings,
        forward_env=forwarded_env(),
        docker_network=get("BASEMODEL_DOCKER_NETWORK", ""),
        user=get("BASEMODEL_CONTAINER_USER", ""),
        k8s_namespace=get("BASEMODEL_K8S_NAMESPACE", "default"),
        k8s_pvc=get("BASEMODEL_K8S_PVC", ""),
        ecs_cluster=get("BASEMODEL_ECS_CLUSTER", ""),
        ecs_task_definition=get("BASEMODEL_ECS_TASK_DEFINITION", ""),
        ecs_subnets=setting_list("BASEMODEL_ECS_SUBNETS"),
        ecs_security_groups=setting_list("BASEMODEL_ECS_SECURITY_GROUPS"),
        termination_timeout_seconds=120 if env == "prod" else 30,
    )


def quality_gates_from_env(env: str) -> QualityGates:
    """Overrides of the config's scenario gates from BASEMODEL_METRIC_FLOOR / BASEMODEL_POPULARITY_MARGIN
    (unset: the config's); ci lets every finite metric through (floor 0, margin -1): CI's tiny synthetic
    data cannot produce a useful model."""
    floor, margin = ("0", "-1") if env == "ci" else ("", "")
    floor, margin = setting("BASEMODEL_METRIC_FLOOR", floor), setting("BASEMODEL_POPULARITY_MARGIN", margin)
    return QualityGates(
        metric_floor=float(floor) if floor else None,
        popularity_margin=float(margin) if margin else None,
    )


def uploader_from_env() -> ArtifactUploader | None:
    """The uploader to BASEMODEL_UPLOAD_URL, None when it is unset."""
    url = setting(UPLOAD_ENV_VAR)
    if not url:
        return None
    endpoint = setting("AWS_ENDPOINT_URL_S3") or setting("AWS_ENDPOINT_URL") or None
    return ArtifactUploader(
        url=url, s3=S3Resource(endpoint_url=endpoint, region_name=setting("AWS_REGION") or None)
    )


def resources_for(env: str, config_path: str | None = None) -> dict[str, Any]:
    """The resource set of one environment. `config_path` (tests, the demo) overrides BASEMODEL_CONFIG."""
    if env not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {env!r}; expected one of {', '.join(ENVIRONMENTS)}")
    if env == "prod" and not config_path:
        config = BasemodelConfigResource(config_path=dg.EnvVar(CONFIG_ENV_VAR))
    else:
        config = BasemodelConfigResource(config_path=config_path or config_path_from_env(env))
    resources: dict[str, Any] = {
        "basemodel_config": config,
        "launcher": launcher_from_env(env),
        "quality_gates": quality_gates_from_env(env),
    }
    uploader = uploader_from_env()
    if uploader is not None:
        resources["uploader"] = uploader
    return resources
