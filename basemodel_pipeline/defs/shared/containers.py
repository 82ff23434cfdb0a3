"""The labels of the containers and pods the launcher starts, and removing the containers of a step or a run
(Docker): a finished, failed or cancelled step leaves no container behind, nor does an ended run."""

from __future__ import annotations

from typing import Any

RUN_ID_LABEL = "dagster/run_id"
STEP_LABEL = "dagster/step_key"
STAGE_LABEL = "basemodel/job"  # label key kept as deployed (a label, not a Dagster job)
MANAGED_LABEL = "basemodel/managed"


def label_value(value: str) -> str:
    """Kubernetes label values: at most 63 characters of [A-Za-z0-9_.-]."""
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "_" for c in value)
    return cleaned[:63].strip("_.-") or "none"


def _remove(client: Any, labels: dict[str, str]) -> list[str]:
    """Remove (stopping first) every container carrying all these labels; `client` None: docker.from_env()."""
    if client is None:
        import docker

        client = docker.from_env()
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    removed = []
    for container in client.containers.list(all=True, filters=filters):
        container.remove(force=True)
        removed.append(container.id)
    return removed


def remove_step_containers(run_id: str, step_key: str, client: Any = None) -> list[str]:
    """Remove the trainer container(s) this launcher started for one step of a run (stopped first).

    Only containers carrying the launcher's own `basemodel/managed` label: DockerRunLauncher labels the run
    worker with the same `dagster/run_id`, and removing it would kill the run before its step is recorded;
    nor those of the run's other steps, which may still be training."""
    labels = {RUN_ID_LABEL: run_id, STEP_LABEL: label_value(step_key), MANAGED_LABEL: "true"}
    return _remove(client, labels)


def remove_run_containers(run_id: str, client: Any = None) -> list[str]:
    """Remove every container labelled with this run id (stopped first): trainer containers and the run
    worker. Only once the run has ended (the run-status sensors): a cancelled or crashed run leaves
    nothing behind, and exited run workers do not pile up."""
    return _remove(client, {RUN_ID_LABEL: run_id})
