"""What every domain's `defs()` is built from: one Deployment, read from the environment once at the root.

env            BASEMODEL_ENV (shared/resources.py: local | ci | prod)
shape          the config that gives the graph its shape (shared/shape.py: the demo's only locally)
resources      the resource set of the environment (shared/resources.py)
running        BASEMODEL_AUTOMATION != stopped: sensors and schedules start running
uploading      BASEMODEL_UPLOAD_URL is set: the uploaded_artifacts asset exists
containers     steps or run workers are containers (launcher backend docker, or
               BASEMODEL_RUN_LAUNCHER=docker): the cleanup sensors exist
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.defs.shared.resources import config_path_from_env, current_env, resources_for
from basemodel_pipeline.defs.shared.shape import shape_config
from basemodel_pipeline.settings import setting

# BASEMODEL_AUTOMATION=stopped starts sensors and the schedule stopped (tests, a paused deployment).
AUTOMATION_ENV_VAR = "BASEMODEL_AUTOMATION"
# BASEMODEL_RUN_LAUNCHER=docker: the instance starts run workers as containers (docker-compose.yml sets it)
RUN_LAUNCHER_ENV_VAR = "BASEMODEL_RUN_LAUNCHER"


@dataclass(frozen=True)
class Deployment:
    env: str
    shape: PipelineConfig
    resources: Mapping[str, Any] = field(default_factory=dict)
    running: bool = True
    uploading: bool = False
    containers: bool = False

    @property
    def sensor_status(self) -> dg.DefaultSensorStatus:
        return dg.DefaultSensorStatus.RUNNING if self.running else dg.DefaultSensorStatus.STOPPED

    @property
    def schedule_status(self) -> dg.DefaultScheduleStatus:
        return dg.DefaultScheduleStatus.RUNNING if self.running else dg.DefaultScheduleStatus.STOPPED


def deployment(config_path: str | None = None, env: str | None = None) -> Deployment:
    """The deployment of this process: `config_path` and `env` default to BASEMODEL_CONFIG, BASEMODEL_ENV.

    Raises a one-line ConfigError outside the local environment when the config is unset or missing."""
    env = env or current_env()
    shape_path = config_path or config_path_from_env(env)
    resources = resources_for(env, config_path)
    return Deployment(
        env=env,
        shape=shape_config(shape_path, env),
        resources=resources,
        running=setting(AUTOMATION_ENV_VAR, "running") != "stopped",
        uploading="uploader" in resources,
        containers=resources["launcher"].backend == "docker" or setting(RUN_LAUNCHER_ENV_VAR) == "docker",
    )


def shape_only(config_path: str, upload: bool = False, env: str = "local") -> Deployment:
    """A deployment that only gives the graph its shape (no resources): in-process runs and tests."""
    return Deployment(env=env, shape=shape_config(config_path, env), uploading=upload)
