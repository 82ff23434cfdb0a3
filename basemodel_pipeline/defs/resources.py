"""Resources, chosen per environment in this one place (env var BASEMODEL_ENV = local | ci | prod).

    local  config path from BASEMODEL_CONFIG (default demo_workspace/config.yaml, resolved when loaded);
           Pipes jobs run as subprocesses of the run worker.
    ci     as local, but the Pipes jobs see no GPU and a fixed hash seed (reproducible CPU runs).
    prod   config path read from BASEMODEL_CONFIG at run time (dg.EnvVar; required), longer grace period
           for training processes to stop after a cancelled run.

Secrets never live here: the YAML config reads them from environment variables (${VAR}) itself.
"""

import os
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline.config import PipelineConfig, load_config

ENV_VAR = "BASEMODEL_ENV"
CONFIG_ENV_VAR = "BASEMODEL_CONFIG"
DEFAULT_CONFIG = "demo_workspace/config.yaml"
ENVIRONMENTS = ("local", "ci", "prod")


class BasemodelConfigResource(dg.ConfigurableResource):
    """Where the pipeline's YAML config lives; assets load it when they run (never at definition time)."""

    config_path: str

    def load(self) -> PipelineConfig:
        return load_config(self.config_path)


def current_env() -> str:
    env = os.environ.get(ENV_VAR, "local")
    if env not in ENVIRONMENTS:
        raise ValueError(f"{ENV_VAR}={env!r} is not one of {', '.join(ENVIRONMENTS)}")
    return env


def config_path_from_env() -> str:
    """BASEMODEL_CONFIG, or the demo config relative to the working directory; always absolute."""
    return str(Path(os.environ.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG).resolve())


def resources_for(env: str, config_path: str | None = None) -> dict[str, Any]:
    """The resource set of one environment. `config_path` (tests, the demo) overrides BASEMODEL_CONFIG."""
    if env not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {env!r}; expected one of {', '.join(ENVIRONMENTS)}")
    if env == "prod":
        config = (
            BasemodelConfigResource(config_path=config_path)
            if config_path
            else BasemodelConfigResource(config_path=dg.EnvVar(CONFIG_ENV_VAR))
        )
        client = dg.PipesSubprocessClient(forward_termination=True, termination_timeout_seconds=120)
    elif env == "ci":
        config = BasemodelConfigResource(config_path=config_path or config_path_from_env())
        client = dg.PipesSubprocessClient(env={"CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"})
    else:
        config = BasemodelConfigResource(config_path=config_path or config_path_from_env())
        client = dg.PipesSubprocessClient()
    return {"basemodel_config": config, "pipes_subprocess_client": client}
